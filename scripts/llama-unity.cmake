# Compiles llama.cpp's heaviest libraries as unity builds: scripts/llama-server.sh passes this
# file as -DCMAKE_PROJECT_INCLUDE, so it runs inside llama.cpp's own configure, after its
# top-level project() call. Most of a llama.cpp file's compile time is parsing the same headers
# (ggml, llama's internals, nlohmann/json), and libllama is some 150 small model files, so one
# parse per sixteen files saves close to half of the llama-server build's CPU (982 s to
# 547 s, README "CI").
#
# Which targets: libllama, mtmd (the multimodal library the server links) and server-context.
# Not llama-common: its files define the same helper names (foreach_function in chat.cpp and
# json.cpp's ordered_json) and cannot share a translation unit. Within the three, files that
# cannot share one stay on their own: gemma3n.cpp and gemma4.cpp each define a static
# ggml_view_2d_slice, and mtmd-helper*.cpp refuse to compile beside mtmd's internal headers.
# A later llama.cpp may add another such pair; scripts/llama-server.sh then builds file by
# file instead.
#
# The targets do not exist yet when this file runs, so the settings are deferred to the end of
# llama.cpp's top-level CMakeLists.txt. llama.cpp's ggml calls project() again, which includes
# this file a second time: the global property makes that a no-op.
function(kvp_llama_unity)
  foreach(target llama mtmd server-context)
    if(TARGET ${target})
      set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 16)
    endif()
  endforeach()
  if(TARGET llama)
    set_source_files_properties(
      ${CMAKE_SOURCE_DIR}/src/models/gemma3n.cpp ${CMAKE_SOURCE_DIR}/src/models/gemma4.cpp
      DIRECTORY ${CMAKE_SOURCE_DIR}/src PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  endif()
  file(GLOB mtmd_helpers ${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper*.cpp)
  if(TARGET mtmd AND mtmd_helpers)
    set_source_files_properties(${mtmd_helpers}
      DIRECTORY ${CMAKE_SOURCE_DIR}/tools/mtmd PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  endif()
endfunction()

get_property(kvp_llama_unity_deferred GLOBAL PROPERTY KVP_LLAMA_UNITY_DEFERRED)
if(NOT kvp_llama_unity_deferred)
  set_property(GLOBAL PROPERTY KVP_LLAMA_UNITY_DEFERRED ON)
  cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL kvp_llama_unity)
endif()
