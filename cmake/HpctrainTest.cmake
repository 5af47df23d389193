# hpctrain_add_test(NAME name COMMAND exe args... [RANKS n] [LABELS l...] [TIMEOUT s] [SKIP_RETURN_CODE c])
# One helper for every test: with RANKS the command runs under mpiexec with that many ranks (and the launcher flags
# below), so unit tests and MPI tests are registered the same way.

# Launcher flags for running tests on a workstation: oversubscribed cores, and root in containers. They differ by MPI
# (Open MPI refuses both without its flags; MPICH's and Intel MPI's Hydra allow both and reject those flags), so they
# are chosen by vendor unless HPCTRAIN_MPIEXEC_FLAGS is set.
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE mpiexec_version ERROR_VARIABLE mpiexec_version
  TIMEOUT 30)
set(default_flags "")
if(mpiexec_version MATCHES "Open MPI|OpenRTE")
  set(HPCTRAIN_MPI_VENDOR "Open MPI")
  set(default_flags --oversubscribe)
  execute_process(COMMAND id -u OUTPUT_VARIABLE uid OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(uid STREQUAL "0")
    list(APPEND default_flags --allow-run-as-root)
  endif()
elseif(mpiexec_version MATCHES "HYDRA|MPICH|Intel\\(R\\) MPI")
  set(HPCTRAIN_MPI_VENDOR "MPICH family")
else()
  set(HPCTRAIN_MPI_VENDOR "unknown")
endif()
string(JOIN " " default_flags ${default_flags})
set(HPCTRAIN_MPIEXEC_FLAGS "${default_flags}" CACHE STRING
  "Flags the tests give mpiexec (default by vendor; Open MPI: --oversubscribe, as root --allow-run-as-root)")
separate_arguments(HPCTRAIN_MPIEXEC_EXTRA UNIX_COMMAND "${HPCTRAIN_MPIEXEC_FLAGS}")
message(STATUS "hpctrain tests: ${MPIEXEC_EXECUTABLE} (${HPCTRAIN_MPI_VENDOR}) ${HPCTRAIN_MPIEXEC_FLAGS}")

# Sanitizer builds: the runtime options every test runs with (tools/sanitizers/README.md says what is suppressed
# and why).
set(HPCTRAIN_SANITIZER_ENVIRONMENT "")
set(sanitizer_files ${PROJECT_SOURCE_DIR}/tools/sanitizers)
if(HPCTRAIN_SANITIZE STREQUAL "address")
  set(HPCTRAIN_SANITIZER_ENVIRONMENT
    "ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:detect_stack_use_after_return=1:strict_string_checks=1"
    "LSAN_OPTIONS=suppressions=${sanitizer_files}/lsan.supp:print_suppressions=0"
    "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=${sanitizer_files}/ubsan.supp")
elseif(HPCTRAIN_SANITIZE STREQUAL "thread")
  set(HPCTRAIN_SANITIZER_ENVIRONMENT
    "TSAN_OPTIONS=suppressions=${sanitizer_files}/tsan.supp:halt_on_error=1:second_deadlock_stack=1")
endif()

function(hpctrain_add_test)
  cmake_parse_arguments(T "" "NAME;RANKS;TIMEOUT;SKIP_RETURN_CODE;WORKING_DIRECTORY" "COMMAND;LABELS;ENVIRONMENT" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  if(HPCTRAIN_SANITIZE)
    math(EXPR T_TIMEOUT "${T_TIMEOUT} * 4")  # instrumented code runs several times slower
  endif()
  if(T_RANKS)
    set(cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${T_RANKS} ${HPCTRAIN_MPIEXEC_EXTRA} ${MPIEXEC_PREFLAGS}
      ${T_COMMAND})
    list(APPEND T_LABELS mpi)
  else()
    set(cmd ${T_COMMAND})
  endif()
  if(NOT T_WORKING_DIRECTORY)
    set(T_WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  endif()
  add_test(NAME ${T_NAME} COMMAND ${cmd} WORKING_DIRECTORY ${T_WORKING_DIRECTORY})
  set(environment OMP_NUM_THREADS=1 ${HPCTRAIN_SANITIZER_ENVIRONMENT} ${T_ENVIRONMENT})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}" ENVIRONMENT "${environment}")
  if(T_RANKS)
    set_property(TEST ${T_NAME} PROPERTY PROCESSORS ${T_RANKS})
  endif()
  if(T_SKIP_RETURN_CODE)
    set_tests_properties(${T_NAME} PROPERTIES SKIP_RETURN_CODE ${T_SKIP_RETURN_CODE})
  endif()
endfunction()
