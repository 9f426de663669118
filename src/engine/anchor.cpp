#include "zerotrain/error.h"
namespace zt { void zt_link_anchor() {} }
