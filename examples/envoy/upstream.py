#!/usr/bin/env python3
"""A stand-in upstream for the walkthroughs: answers every request, on any
path, `200 ok`, so what Envoy answers is what tollgate decided.

    python3 examples/envoy/upstream.py 8000
"""

import http.server
import sys


class Ok(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self):
        body = b"ok\n"
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = answer

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Ok).serve_forever()
