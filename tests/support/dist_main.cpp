// gtest main for multi-rank tests: every rank runs every test; only rank 0 prints the
// gtest report, and the exit code is non-zero on any rank that failed.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <mpi.h>
#include <cstdlib>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  torch::set_num_threads(1);
  int rank = 0;
  const char* r = std::getenv("RANK");
  if (r) rank = std::atoi(r);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int finalized = 0, initialized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    int all = 0;
    MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    rc = all;
    MPI_Finalize();
  }
  return rc;
}
