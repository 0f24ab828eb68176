# strata_cc_library(NAME n HDRS ... SRCS ... DEPS ...)
#   Defines library strata_<n> with alias strata::<n>. With no SRCS it is an
#   INTERFACE library.
function(strata_cc_library)
  cmake_parse_arguments(S "" "NAME" "HDRS;SRCS;DEPS" ${ARGN})
  set(_target strata_${S_NAME})
  if(S_SRCS)
    add_library(${_target} STATIC ${S_SRCS} ${S_HDRS})
    target_link_libraries(${_target} PUBLIC ${S_DEPS})
    target_compile_options(${_target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-sign-compare>)
  else()
    add_library(${_target} INTERFACE)
    target_link_libraries(${_target} INTERFACE ${S_DEPS})
  endif()
  add_library(strata::${S_NAME} ALIAS ${_target})
endfunction()

# strata_cc_binary(NAME n SRCS ... DEPS ...): binary build/bin/<n>.
function(strata_cc_binary)
  cmake_parse_arguments(S "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${S_NAME} ${S_SRCS})
  target_link_libraries(${S_NAME} PRIVATE ${S_DEPS})
endfunction()

# strata_cc_test(NAME n SRCS ... DEPS ... [LABELS ...] [TIMEOUT s])
#   One gtest binary registered as one ctest named n.
function(strata_cc_test)
  if(NOT STRATA_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(S "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${S_NAME} ${S_SRCS})
  set_target_properties(${S_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_link_libraries(${S_NAME} PRIVATE ${S_DEPS} strata::testing GTest::gtest GTest::gmock GTest::gtest_main)
  add_test(NAME ${S_NAME} COMMAND ${S_NAME})
  if(NOT S_TIMEOUT)
    set(S_TIMEOUT 120)
  endif()
  set_tests_properties(${S_NAME} PROPERTIES TIMEOUT ${S_TIMEOUT})
  if(S_LABELS)
    set_tests_properties(${S_NAME} PROPERTIES LABELS "${S_LABELS}")
  endif()
endfunction()

# strata_cc_fuzz(NAME n SRCS ... DEPS ...)
#   A fuzz target: SRCS define LLVMFuzzerTestOneInput; its seed corpus is
#   ${CMAKE_CURRENT_SOURCE_DIR}/corpus/<n>/ (tests/fuzz/README.md).
#   With STRATA_FUZZ (clang, scripts/fuzz.sh): the libFuzzer binary
#   build-fuzz/fuzz/<n>_fuzz. Otherwise, with the tests: <n>_fuzz_replay,
#   the target linked with tests/fuzz/replay_main.cc, and the ctest
#   <n>_fuzz_corpus_test (label fuzz) that runs the corpus through it once.
function(strata_cc_fuzz)
  cmake_parse_arguments(S "" "NAME" "SRCS;DEPS" ${ARGN})
  if(STRATA_FUZZ)
    add_executable(${S_NAME}_fuzz ${S_SRCS})
    set_target_properties(${S_NAME}_fuzz PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
    target_link_libraries(${S_NAME}_fuzz PRIVATE ${S_DEPS})
    target_link_options(${S_NAME}_fuzz PRIVATE -fsanitize=fuzzer)
  elseif(STRATA_BUILD_TESTS)
    add_executable(${S_NAME}_fuzz_replay ${S_SRCS} ${PROJECT_SOURCE_DIR}/tests/fuzz/replay_main.cc)
    set_target_properties(${S_NAME}_fuzz_replay PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
    target_link_libraries(${S_NAME}_fuzz_replay PRIVATE ${S_DEPS})
    add_test(NAME ${S_NAME}_fuzz_corpus_test
             COMMAND ${S_NAME}_fuzz_replay ${CMAKE_CURRENT_SOURCE_DIR}/corpus/${S_NAME})
    set_tests_properties(${S_NAME}_fuzz_corpus_test PROPERTIES TIMEOUT 120 LABELS fuzz)
  endif()
endfunction()
