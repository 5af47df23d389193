// A library that tests/CMakeLists.txt builds into a folder no loader searches: the fake CUDA module that needs it
// stands for a module whose CUDA library is not installed.
int hpctrain_test_absent_library(void) { return 1; }
