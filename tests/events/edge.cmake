# SPDX-License-Identifier: MIT
# Edge cases of how libgdrcache meets the CUDA driver (included from tests/events/CMakeLists.txt,
# after ev_env is set). Each program says what it proves at its top.
#   edge_early       a cache made before the program has any CUDA context (MPI_Init before
#                    cudaSetDevice), and one made on a thread without a context while the program's
#                    only context is device 1's: both must validate by events once the interception
#                    is in place (fails while the probe needs a context for a test allocation)
#   edge_fresh_race  libcuda loaded by another thread between libgdrcache's "not loaded yet" check
#                    and its patching, with a thread stopped inside cuMemFree_v2's first
#                    instructions: that thread must resume unharmed
#   edge_tls         libgdrcache's static TLS fits glibc's share per library, and it still dlopens
#                    after another library took most of the surplus (fails with 604 bytes of TLS)
#   edge_load        stub address taken (nothing stale), threads calling the driver while it is
#                    patched with its stub addresses taken or past the top (no ASLR): events, two copies of libgdrcache,
#                    dlclose, RTLD_DEEPBIND, event ring overrun (events_lost drops everything)

function(edge_exe name)
  add_executable(${name} ${name}.c)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/lib ${PROJECT_SOURCE_DIR}/include
    ${PROJECT_BINARY_DIR}/include)
  target_link_libraries(${name} PRIVATE Threads::Threads ${CMAKE_DL_LIBS})
  add_dependencies(${name} gdrcache gdr_fake_cuda)
endfunction()

edge_exe(edge_early)
edge_exe(edge_load)
target_include_directories(edge_load PRIVATE ${PROJECT_SOURCE_DIR}/tests/support)

add_test(NAME events_edge_early COMMAND edge_early $<TARGET_FILE:gdrcache>)
add_test(NAME events_edge_early_otherdev COMMAND edge_early $<TARGET_FILE:gdrcache> otherdev)
set(edge_tests events_edge_early events_edge_early_otherdev)

set(edge_load_modes stubtaken busy busy_norand dlclose ringlost probelap)
if(NOT GDR_SANITIZE) # the sanitizers' runtimes refuse RTLD_DEEPBIND (google/sanitizers#611)
  list(APPEND edge_load_modes deepbind)
endif()
foreach(m ${edge_load_modes})
  add_test(NAME events_edge_${m} COMMAND edge_load ${m} $<TARGET_FILE:gdrcache>)
  list(APPEND edge_tests events_edge_${m})
endforeach()
# Under gdb, as a developer runs a program (no ASLR, threads traced): the threads calling the
# driver while it is patched, events in effect. Not under a sanitizer (LeakSanitizer refuses to
# run under ptrace).
if(NOT GDR_SANITIZE)
  add_test(NAME events_edge_busy_gdb COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/under_gdb.sh
    $<TARGET_FILE:edge_load> busy_norand $<TARGET_FILE:gdrcache>)
  list(APPEND edge_tests events_edge_busy_gdb)
endif()

# Two copies of the library under two names: the second is a copy made at build time.
add_custom_command(OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/edge_libgdrcache_copy.so
  COMMAND ${CMAKE_COMMAND} -E copy $<TARGET_FILE:gdrcache> ${CMAKE_CURRENT_BINARY_DIR}/edge_libgdrcache_copy.so
  DEPENDS gdrcache)
add_custom_target(edge_libgdrcache_copy ALL DEPENDS ${CMAKE_CURRENT_BINARY_DIR}/edge_libgdrcache_copy.so)
add_test(NAME events_edge_twice COMMAND edge_load twice $<TARGET_FILE:gdrcache>
  ${CMAKE_CURRENT_BINARY_DIR}/edge_libgdrcache_copy.so)
list(APPEND edge_tests events_edge_twice)

# Interposes dlopen (the executable exports it): not under a sanitizer, whose runtime owns dlopen.
if(NOT GDR_SANITIZE AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  edge_exe(edge_fresh_race)
  set_target_properties(edge_fresh_race PROPERTIES ENABLE_EXPORTS ON)
  add_test(NAME events_edge_fresh_race COMMAND edge_fresh_race $<TARGET_FILE:gdrcache>)
  list(APPEND edge_tests events_edge_fresh_race)
endif()

# Static TLS sizes are those of a plain build (a sanitizer's runtime takes its own).
if(NOT GDR_SANITIZE)
  add_library(edge_tls_hog SHARED edge_tls_hog.c)
  edge_exe(edge_tls)
  add_test(NAME events_edge_tls COMMAND edge_tls $<TARGET_FILE:gdrcache> $<TARGET_FILE:edge_tls_hog>)
  list(APPEND edge_tests events_edge_tls)
endif()

set(edge_env ${ev_env})
if(GDR_SANITIZE MATCHES "thread")
  list(APPEND edge_env EDGE_SIGNALS_DEFERRED=1) # edge_load busy: see m_busy
endif()
set_tests_properties(${edge_tests} PROPERTIES LABELS unit SKIP_RETURN_CODE 77 TIMEOUT 120
  ENVIRONMENT "${edge_env}")
foreach(t ${edge_tests})
  gdr_no_qemu(${t})
endforeach()
