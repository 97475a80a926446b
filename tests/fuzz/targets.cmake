# The fuzz targets and what each links; included by CMakeLists.txt (libFuzzer builds) and by
# replay.cmake (corpus replay in the normal build).
set(KVP_FUZZ_TARGETS request_path http_request config manifest llama_replies request_rewrite
    request_reader prefix_chain)
set(KVP_FUZZ_LIBS_request_path kvp_core)
set(KVP_FUZZ_LIBS_http_request kvp_core kvp_asio)
set(KVP_FUZZ_LIBS_config kvp_config)
set(KVP_FUZZ_LIBS_manifest kvp_core)
set(KVP_FUZZ_LIBS_llama_replies kvp_backends)
set(KVP_FUZZ_LIBS_request_rewrite kvp_core)
set(KVP_FUZZ_LIBS_request_reader kvp_http)
set(KVP_FUZZ_LIBS_prefix_chain kvp_core)
