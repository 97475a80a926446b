// Streams one HTTP response from upstream to the client as it arrives (SSE included):
// the header goes out first, then each body piece as soon as the parser yields it.
// Follows Beast's relay recipe with the 1.81 pitfalls handled (docs/conventions.md §4):
// buffer_body, async_read_some, no body limit, the empty-chunk guard (beast#3032), and
// per-read/per-write timeouts instead of one deadline.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <boost/beast/core/stream_traits.hpp>

#include "backends/net.hpp"

namespace kvp::proxy {

struct relay_options {
  std::chrono::milliseconds upstream_idle{3'600'000};  // per upstream read
  std::chrono::milliseconds client_write{60'000};      // per client write
  std::size_t chunk = 64 * 1024;
  // The generation outlives the client (a resumable stream, core/resumable_stream.hpp): when
  // writing to the client fails, the rest of upstream's response is still read (and dropped),
  // so the slot's lease lasts until llama-server's generation ends.
  bool outlives_client = false;
};

// How a relay ended. The first ending counts: a client that left while upstream then broke
// (a generation read on after its client, relay_options::outlives_client) ended client_gone.
enum class relay_end {
  none,                // not ended (or the request never reached upstream)
  delivered,           // the whole body reached the client
  upstream_broke,      // upstream closed or sent what cannot be relayed (a 101, endless 1xx)
  upstream_timed_out,  // an upstream read exceeded relay_options::upstream_idle
  client_gone,         // writing to the client failed, or the client hung up
};

// What happened, for the caller to turn into a log line or a status. Filled in as the relay
// progresses, so it stays meaningful when the relay is cancelled part-way.
struct relay_state {
  relay_end end = relay_end::none;
  bool request_sent = false;     // the request reached upstream (set by the caller)
  bool header_received = false;  // upstream answered (its status is `status`)
  bool header_sent = false;      // the client has seen the status line
  bool upstream_done = false;    // upstream's whole response was read (the slot's work is over)
  bool upstream_reusable = false;  // upstream complete and keep-alive: may go back to the pool,
                                   // whatever became of the client
  bool client_keep_alive = false;  // what the client was told (HTTP/1.0 streams must close)
  unsigned status = 0;
  std::size_t body_bytes = 0;
};

// Hop-by-hop fields (RFC 9110 §7.6.1), besides those named in Connection.
inline constexpr http::field hop_by_hop_fields[] = {
    http::field::connection, http::field::keep_alive,         http::field::proxy_connection,
    http::field::te,         http::field::trailer,            http::field::transfer_encoding,
    http::field::upgrade,    http::field::proxy_authenticate, http::field::proxy_authorization};

// Removes hop-by-hop fields, including any named in Connection.
template <class Fields>
void strip_hop_by_hop(Fields& f) {
  std::vector<std::string> named;
  for (auto tok : http::token_list{f[http::field::connection]}) named.emplace_back(tok);
  for (const auto& n : named) f.erase(n);
  for (auto fld : hop_by_hop_fields) f.erase(fld);
}

// Records how the relay ended, unless it already had.
inline void end_with(relay_state& st, relay_end how) {
  if (st.end == relay_end::none) st.end = how;
}

namespace detail {
template <class S>
void expire(S& s, std::chrono::milliseconds d) {
  if constexpr (requires { s.expires_after(d); }) s.expires_after(d);
}

// Keeps the first KiB and the last 8-16 KiB of the body: a stream's final event (timings,
// finish reason) is at its end; a whole OpenAI reply's finish_reason, and a Messages stream's
// `message_start` with its reused-token count, at its start (core/reply_end.hpp and
// core/response_timings.hpp read both).
inline constexpr std::size_t kept_head_bytes = 1024;
inline void keep_tail(std::string* tail, const char* data, std::size_t n) {
  if (!tail || n == 0) return;
  tail->append(data, n);
  if (tail->size() > 16 * 1024)
    tail->erase(kept_head_bytes, tail->size() - 8 * 1024 - kept_head_bytes);
}

// 1xx responses read past before the exchange is taken as broken.
inline constexpr int max_interim_responses = 8;

inline void upstream_error(relay_state& st, const beast::error_code& ec) {
  end_with(st, ec == beast::error::timeout ? relay_end::upstream_timed_out
                                           : relay_end::upstream_broke);
}

// Reads what is left of the response `p` parses into `buf`, keeping the tail; returns whether
// it was read to its end.
template <class Upstream, class Parser>
net::awaitable<bool> drain_body(Upstream& upstream, beast::flat_buffer& ubuf, Parser& p, std::span<char> buf,
                                const relay_options& opts, relay_state& st, std::string* tail) {
  while (!p.is_done()) {
    p.get().body().data = buf.data();
    p.get().body().size = buf.size();
    expire(upstream, opts.upstream_idle);
    auto [rec, rn] = co_await http::async_read_some(upstream, ubuf, p, token);
    if (rec == http::error::need_buffer) rec = {};
    if (rec) {
      upstream_error(st, rec);
      co_return false;
    }
    const std::size_t got = buf.size() - p.get().body().size;
    st.body_bytes += got;
    keep_tail(tail, buf.data(), got);
  }
  co_return true;
}
}  // namespace detail

// Reads the response header from `upstream` (the request was already written), rewrites it
// for a client speaking HTTP/1.`client_version` with `client_keep_alive`, and streams the
// body. `head_request`: the response has no body whatever its headers say.
// Returns with `st` filled in; never throws for I/O errors. With `tail`, the last few KiB of
// the body are kept there (llama-server puts `timings` in its final event), for the reuse
// counters of session requests; auxiliary and unmanaged requests pass nullptr and copy nothing.
template <class Upstream, class Client>
net::awaitable<void> relay_response(Upstream& upstream, beast::flat_buffer& ubuf, Client& client,
                                    unsigned client_version, bool client_keep_alive,
                                    bool head_request, relay_options opts, relay_state& st,
                                    std::string* tail = nullptr) {
  static_assert(beast::is_async_read_stream<Upstream>::value, "Upstream must be readable");
  static_assert(beast::is_async_write_stream<Client>::value, "Client must be writable");
  // RFC 9110 §15.2: 1xx responses are interim; the final response follows on the same
  // connection. llama-server sends none (kvpersist strips Expect, and never asks for an
  // Upgrade), so one comes from something between the two: it is read past and dropped, not
  // relayed (103 Early Hints only suggests preloads to browsers, and HTTP/1.0 clients must
  // not get a 1xx at all), and the connection is closed afterwards rather than pooled. A 101
  // switches to a protocol kvpersist does not speak: the exchange fails, and the connection
  // with it.
  std::optional<http::response_parser<http::buffer_body>> parser;
  bool interim = false;
  for (int n = 0;; ++n) {
    parser.emplace();
    parser->body_limit(boost::none);  // an SSE stream has no natural bound
    if (head_request) parser->skip(true);
    detail::expire(upstream, opts.upstream_idle);
    auto [hec, hn] = co_await http::async_read_header(upstream, ubuf, *parser, token);
    if (hec) {
      detail::upstream_error(st, hec);
      co_return;
    }
    st.header_received = true;
    st.status = parser->get().result_int();
    if (st.status >= 200) break;
    if (st.status == 101 || n == detail::max_interim_responses) {
      end_with(st, relay_end::upstream_broke);
      co_return;
    }
    interim = true;
  }
  auto& p = *parser;
  // Not eager: with eager(true) Beast 1.81 parses past the end of a chunk's body into the
  // next chunk header, gets need_more and reads again without returning the body it has,
  // which holds whole SSE events back until the buffer fills (found by the fake-server
  // streaming test). Header-only reads this leaves are skipped by the guard below.
  auto& res = p.get();
  const bool upstream_keep = res.keep_alive();
  const auto length = p.content_length();
  const bool chunked_in = p.chunked();
  strip_hop_by_hop(res.base());
  res.version(client_version);
  bool keep = client_keep_alive;
  if (length) {
    res.content_length(*length);
  } else if (chunked_in || !p.is_done()) {
    if (client_version >= 11) {
      res.chunked(true);
    } else {
      keep = false;  // HTTP/1.0 has no chunked encoding: the close ends the body
    }
  }
  res.keep_alive(keep);
  st.client_keep_alive = keep;
  // Once upstream's response is read whole, its connection is clean whatever the client
  // does next: a client that reads `data: [DONE]` and closes must not cost a new connection
  // (and a new /props read) to the next request.
  const auto upstream_finished = [&st, upstream_keep, interim] {
    st.upstream_done = true;
    st.upstream_reusable = upstream_keep && !interim;
  };

  http::response_serializer<http::buffer_body> sr{res};
  // Not zeroed: the parser writes before anything reads (a zeroed 64 KiB was a quarter of
  // the instructions of a small resident request).
  const auto buf_data = std::make_unique_for_overwrite<char[]>(opts.chunk);
  const std::span<char> buf(buf_data.get(), opts.chunk);

  // A small body of known length is a non-streaming reply, which llama-server sends right
  // behind its header: read it whole, and the final write below sends header and body at
  // once. If upstream fails meanwhile, the client has seen nothing and gets a clean 502.
  const bool whole = length && *length > 0 && *length <= buf.size() && !p.is_done();
  if (whole) {
    res.body().data = buf.data();
    res.body().size = buf.size();
    while (!p.is_done()) {
      detail::expire(upstream, opts.upstream_idle);
      auto [rec, rn] = co_await http::async_read_some(upstream, ubuf, p, token);
      if (rec) {
        detail::upstream_error(st, rec);
        co_return;
      }
    }
    const std::size_t got = buf.size() - res.body().size;
    res.body().data = buf.data();
    res.body().size = got;
    res.body().more = false;
    st.body_bytes = got;
    upstream_finished();
    detail::keep_tail(tail, buf.data(), got);
  } else {
    detail::expire(client, opts.client_write);
    auto [whe, whn] = co_await http::async_write_header(client, sr, token);
    if (whe) {
      end_with(st, relay_end::client_gone);
      if (opts.outlives_client && co_await detail::drain_body(upstream, ubuf, p, buf, opts, st, tail))
        upstream_finished();
      co_return;
    }
    st.header_sent = true;
  }

  while (!p.is_done()) {
    res.body().data = buf.data();
    res.body().size = buf.size();
    detail::expire(upstream, opts.upstream_idle);
    auto [rec, rn] = co_await http::async_read_some(upstream, ubuf, p, token);
    if (rec == http::error::need_buffer) rec = {};
    if (rec) {
      // Ending the client's response cleanly would make a truncated answer look complete;
      // the caller closes the connection instead (docs/design.md §17).
      detail::upstream_error(st, rec);
      co_return;
    }
    const std::size_t got = buf.size() - res.body().size;
    // beast#3032: {ptr, 0} would be serialized as the last-chunk and end the stream early,
    // so a read that produced no body bytes (a chunk header alone) writes nothing, and the
    // final flush hands the serializer nullptr.
    if (got == 0 && !p.is_done()) continue;
    res.body().data = got ? buf.data() : nullptr;
    res.body().size = got;
    res.body().more = !p.is_done();
    st.body_bytes += got;
    if (p.is_done()) upstream_finished();
    detail::keep_tail(tail, buf.data(), got);
    detail::expire(client, opts.client_write);
    auto [wec, wn] = co_await http::async_write(client, sr, token);
    if (wec == http::error::need_buffer) wec = {};
    if (wec) {
      end_with(st, relay_end::client_gone);
      if (opts.outlives_client && co_await detail::drain_body(upstream, ubuf, p, buf, opts, st, tail))
        upstream_finished();
      co_return;
    }
  }
  if (!sr.is_done()) {
    if (!whole) {  // the end of a streamed body (the whole one is already in place)
      res.body().data = nullptr;
      res.body().size = 0;
      res.body().more = false;
    }
    detail::expire(client, opts.client_write);
    auto [fec, fn] = co_await http::async_write(client, sr, token);
    if (fec && fec != http::error::need_buffer) {
      end_with(st, relay_end::client_gone);
      co_return;
    }
  }
  st.header_sent = true;
  upstream_finished();
  end_with(st, relay_end::delivered);
}

}  // namespace kvp::proxy
