// The agent's HTTP endpoint (/metrics on --metrics-addr): one resource, GET and HEAD, served by one
// thread over non-blocking sockets. Built so that no client can keep a scrape from being answered:
// every connection has a deadline for its request head and one for its response, the head's size
// is capped, and when the connections are at their cap a new one pushes out the one idle longest
// instead of waiting behind it. One request per connection (Connection: close).
#ifndef LIFELINE_AGENT_NET_HTTP_SERVER_H_
#define LIFELINE_AGENT_NET_HTTP_SERVER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "lifeline/status.h"

namespace lifeline::net {

struct HttpServerOptions {
  // From accept to the blank line that ends the request head; a client still sending then is
  // closed without an answer (a scraper sends its head at once).
  std::chrono::milliseconds head_timeout{5000};
  // From the end of the head to the last byte of the response taken by the kernel; a client that
  // does not read is closed.
  std::chrono::milliseconds response_timeout{10000};
  // A longer head is answered 431 and closed.
  size_t max_head_bytes = 8192;
  // Connections held at once; one more closes the connection idle longest.
  size_t max_connections = 32;
};

// The one resource served: GET (and HEAD) of `path` answers 200 with `render()`'s text; any other
// path 404, any other method on `path` 405.
struct HttpResource {
  std::string path;
  std::string content_type;
  std::function<std::string()> render;  // called on the server's thread, one call per request
};

// Thread-safety: the object is only created and destroyed; its thread is its own. `render` must
// be safe to call from that thread while the owner goes on.
class HttpServer {
 public:
  // Serves `resource` on `listen_fd` (a listening TCP socket, IPv4 or IPv6, which the server
  // takes over and closes). Fails only when the thread or its wake-up descriptor cannot be made.
  static Result<std::unique_ptr<HttpServer>> Start(int listen_fd, HttpResource resource,
                                                   HttpServerOptions options = {});
  // Stops the thread and closes the listening socket and every connection.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The port the listening socket is bound to.
  uint16_t port() const { return port_; }

 private:
  HttpServer(int listen_fd, int wake_fd, HttpResource resource, HttpServerOptions options);
  // The thread: every connection's state is its own, none is shared.
  void Loop();

  const int listen_fd_;
  const int wake_fd_;  // an eventfd: the destructor's write ends poll()
  const HttpResource resource_;
  const HttpServerOptions options_;
  const uint16_t port_;
  std::thread thread_;
};

}  // namespace lifeline::net

#endif  // LIFELINE_AGENT_NET_HTTP_SERVER_H_
