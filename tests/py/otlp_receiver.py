"""An OTLP/HTTP receiver for the tests: decodes each request with the
OpenTelemetry protobuf messages (PyPI's opentelemetry-proto) and prints one
JSON line per log record and per metric data point on stdout.

Usage: otlp_receiver.py PORT [UID]

With UID, it becomes that user (after its imports, before it listens), so
that the listening socket is that user's, as a local user's would be.
"""

import json
import os
import socket
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def attrs(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def emit(obj):
    print(json.dumps(obj), flush=True)


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        ctype = self.headers.get("Content-Type", "")
        if self.path == "/v1/logs":
            req = logs_service_pb2.ExportLogsServiceRequest()
            req.ParseFromString(body)
            for rl in req.resource_logs:
                res = attrs(rl.resource.attributes)
                for sl in rl.scope_logs:
                    for r in sl.log_records:
                        emit({
                            "signal": "log",
                            "content_type": ctype,
                            "resource": res,
                            "event_name": r.event_name,
                            "severity": r.severity_text,
                            "time_unix_nano": r.time_unix_nano,
                            "body": value(r.body),
                            "attributes": attrs(r.attributes),
                        })
            reply = logs_service_pb2.ExportLogsServiceResponse()
        elif self.path == "/v1/metrics":
            req = metrics_service_pb2.ExportMetricsServiceRequest()
            req.ParseFromString(body)
            for rm in req.resource_metrics:
                res = attrs(rm.resource.attributes)
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        for p in getattr(m, kind).data_points:
                            emit({
                                "signal": "metric",
                                "resource": res,
                                "name": m.name,
                                "kind": kind,
                                "monotonic": kind == "sum" and m.sum.is_monotonic,
                                "attributes": attrs(p.attributes),
                                "value": value(p) if p.WhichOneof("value") else None,
                            })
            reply = metrics_service_pb2.ExportMetricsServiceResponse()
        else:
            self.send_response(404)
            self.end_headers()
            return
        out = reply.SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def main():
    if len(sys.argv) > 2:
        # What binding imports lazily, read while the files under root's
        # home are still readable.
        socket.getfqdn("127.0.0.1")
        uid = int(sys.argv[2])
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    server = HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    emit({"signal": "listening", "port": server.server_port})
    server.serve_forever()


if __name__ == "__main__":
    main()
