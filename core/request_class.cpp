#include "core/request_class.hpp"

#include <array>

namespace kvp::core {

namespace {

// Every llama-server route that creates a slot task (tools/server/server.cpp routes).
constexpr std::array<std::string_view, 21> inference_paths = {
    "/completion",     "/completions",     "/v1/completions",  "/chat/completions",
    "/v1/chat/completions", "/responses",   "/v1/responses",    "/infill",
    "/v1/messages",    "/embedding",       "/embeddings",      "/v1/embeddings",
    "/rerank",         "/reranking",       "/v1/rerank",       "/v1/reranking",
    "/api/chat",       "/api/generate",    "/v1/audio/transcriptions",
    "/audio/transcriptions", "/v1/infill"};

}  // namespace

endpoint_kind classify_target(std::string_view target) {
  std::string_view path = target.substr(0, target.find_first_of("?#"));
  // Collapse a trailing slash so "/v1/chat/completions/" is not a way around the lease.
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  if (path == "/slots" || path.starts_with("/slots/")) return endpoint_kind::slots;
  for (auto p : inference_paths)
    if (path == p) return endpoint_kind::inference;
  return endpoint_kind::passthrough;
}

}  // namespace kvp::core
