#!/usr/bin/env python3
"""A payment service for the orders example, in Python's standard library.

POST /charges             {"order_id", "cents"} -> 200 {"id"}; 402 when cents > 10000
POST /charges/<id>/refund -> 200 {"ok": true}
GET  /stats               -> what it did, for the example's summary

Every POST must carry "Authorization: Bearer $PAYMENTS_TOKEN" and an
Idempotency-Key: a request whose key was seen before gets the first answer
again and changes nothing, so a relay that retries after a crash charges once.
"""
import json
import os
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = os.environ.get("PAYMENTS_TOKEN", "")
LOCK = threading.Lock()
ANSWERS = {}  # idempotency key -> (status, body)
STATS = {"charges": 0, "declined": 0, "refunds": 0, "retries_deduplicated": 0, "charged_orders": {}}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):  # quiet: the example prints a summary
        pass

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path != "/stats":
            return self.answer(404, {"error": "not found"})
        with LOCK:
            return self.answer(200, STATS)

    def do_POST(self):
        if self.headers.get("Authorization") != "Bearer " + TOKEN:
            return self.answer(401, {"error": "bad token"})
        key = self.headers.get("Idempotency-Key")
        if not key:
            return self.answer(400, {"error": "Idempotency-Key is required"})
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        with LOCK:
            if key in ANSWERS:
                STATS["retries_deduplicated"] += 1
                return self.answer(*ANSWERS[key])
            if self.path == "/charges":
                if int(body.get("cents", 0)) > 10000:
                    STATS["declined"] += 1
                    result = (402, {"error": "declined: over the limit"})
                else:
                    STATS["charges"] += 1
                    order = body.get("order_id", "")
                    STATS["charged_orders"][order] = STATS["charged_orders"].get(order, 0) + 1
                    result = (200, {"id": "ch_" + uuid.uuid4().hex[:12]})
            elif self.path.startswith("/charges/") and self.path.endswith("/refund"):
                STATS["refunds"] += 1
                result = (200, {"ok": True})
            else:
                result = (404, {"error": "not found"})
            ANSWERS[key] = result
        return self.answer(*result)


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8099
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
