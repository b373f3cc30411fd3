"""An HTTPS server for the egress tests and benchmarks: listens on 127.0.0.1:PORT with
CERT/KEY and answers every GET `ok` (HTTP/1.1, keep-alive). Usage: https_server.py PORT CERT KEY"""

import http.server
import ssl
import sys


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


port, cert, key = sys.argv[1:4]
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(port)), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
