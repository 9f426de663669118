#include <cstdio>
int main() { std::puts("zerotrain"); return 0; }
