/* A test double preloaded (LD_PRELOAD) by tests/cli/start_checks.sh: answers that the real MPI and C libraries do not
 * give on a test machine, switched on by environment variables so that the checks on them can be seen to work.
 *   HPCTRAIN_TEST_MPI_THREAD_SINGLE=1  MPI_Init_thread reports MPI_THREAD_SINGLE (an MPI built without threads)
 *   HPCTRAIN_TEST_SIGACTION_FAILS=1    sigaction(SIGUSR1, ...) fails with EINVAL */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <mpi.h>
#include <signal.h>
#include <stdlib.h>

int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  const int status = PMPI_Init_thread(argc, argv, required, provided); /* the MPI profiling interface */
  if (getenv("HPCTRAIN_TEST_MPI_THREAD_SINGLE") != NULL) *provided = MPI_THREAD_SINGLE;
  return status;
}

int sigaction(int signal_number, const struct sigaction* action, struct sigaction* previous) {
  typedef int (*Sigaction)(int, const struct sigaction*, struct sigaction*);
  static Sigaction next = NULL;
  if (next == NULL) next = (Sigaction)dlsym(RTLD_NEXT, "sigaction");
  if (getenv("HPCTRAIN_TEST_SIGACTION_FAILS") != NULL && signal_number == SIGUSR1 && action != NULL) {
    errno = EINVAL;
    return -1;
  }
  return next(signal_number, action, previous);
}
