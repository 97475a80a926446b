# Included from tests/CMakeLists.txt. The fuzz corpus as regression tests in the normal build
# (no libFuzzer, any compiler): every file in tests/fuzz/corpus/<target>/ goes through the
# target's properties (label unit). Reproducers of reported bugs live in
# tests/fuzz/known_bugs/<target>/ and are replayed with KVP_FUZZ_STRICT=1 as expected failures
# (WILL_FAIL, like a strict xfail): fixing the bug makes that test fail until the reproducer
# moves into the corpus.
include(${CMAKE_SOURCE_DIR}/tests/fuzz/targets.cmake)
foreach(t IN LISTS KVP_FUZZ_TARGETS)
  add_executable(replay_${t} ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_${t}.cpp
                             ${CMAKE_SOURCE_DIR}/tests/fuzz/replay_main.cpp)
  target_link_libraries(replay_${t} PRIVATE ${KVP_FUZZ_LIBS_${t}} kvp_warnings)
  add_test(NAME fuzz_corpus:${t} COMMAND replay_${t} ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/${t})
  set_tests_properties(fuzz_corpus:${t} PROPERTIES LABELS unit TIMEOUT 120)
  file(GLOB known ${CMAKE_SOURCE_DIR}/tests/fuzz/known_bugs/${t}/*)
  foreach(k IN LISTS known)
    get_filename_component(kn ${k} NAME)
    add_test(NAME fuzz_known_bug:${t}:${kn} COMMAND replay_${t} ${k})
    set_tests_properties(fuzz_known_bug:${t}:${kn} PROPERTIES LABELS unit WILL_FAIL TRUE
                         ENVIRONMENT "KVP_FUZZ_STRICT=1" TIMEOUT 60)
  endforeach()
endforeach()
