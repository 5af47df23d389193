/* A test double preloaded (LD_PRELOAD) by tests/cli/start_checks.sh: answers that the real MPI and C libraries do not
 * give on a test machine, switched on by environment variables so that the checks on them can be seen to work.
 *   HPCTRAIN_TEST_MPI_THREAD_SINGLE=1  MPI_Init_thread reports MPI_THREAD_SINGLE (an MPI built without threads)
 *   HPCTRAIN_TEST_SIGMASK_FAILS=1      pthread_sigmask blocking a set with SIGUSR1 fails with EINVAL
 *   HPCTRAIN_TEST_UNBLOCK_FAILS=1      pthread_sigmask unblocking any set fails with EINVAL */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  const int status = PMPI_Init_thread(argc, argv, required, provided); /* the MPI profiling interface */
  if (getenv("HPCTRAIN_TEST_MPI_THREAD_SINGLE") != NULL) *provided = MPI_THREAD_SINGLE;
  return status;
}

int pthread_sigmask(int how, const sigset_t* set, sigset_t* previous) {
  typedef int (*Sigmask)(int, const sigset_t*, sigset_t*);
  static Sigmask next = NULL;
  if (next == NULL) next = (Sigmask)dlsym(RTLD_NEXT, "pthread_sigmask");
  if (getenv("HPCTRAIN_TEST_SIGMASK_FAILS") != NULL && how == SIG_BLOCK && set != NULL &&
      sigismember(set, SIGUSR1) == 1)
    return EINVAL; /* pthread_sigmask returns the error number */
  if (getenv("HPCTRAIN_TEST_UNBLOCK_FAILS") != NULL && how == SIG_UNBLOCK) return EINVAL;
  return next(how, set, previous);
}
