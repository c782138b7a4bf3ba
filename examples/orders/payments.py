#!/usr/bin/env python3
"""A payment service for the orders example, in Python's standard library.

POST /charges   {"order_id", "cents"} -> 200 {"id"}; 402 when cents > 10000
POST /refunds   {"charge_key"}        -> 200 {"ok": true, "refunded": <charge id or null>}
GET  /stats                           -> what it did, for the example's summary

Every POST must carry "Authorization: Bearer $PAYMENTS_TOKEN" and an
Idempotency-Key: a request whose key was seen before gets the first answer
again and changes nothing, so a relay that retries after a crash charges once.

A refund names the charge by the Idempotency-Key its charge request carried
(charge_key), not by the charge's id: a charge whose answer never arrived
(it timed out after the service acted) has no id on the caller's side, but
its key is known. A key that charged nothing refunds nothing, and says so.

A charge of exactly PAYMENTS_SLOW_CENTS cents (default 6666) is made at once
and answered only after PAYMENTS_SLOW_SECONDS (default 15), every time it is
asked again: the service acts, then times out, as real ones do.
"""
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = os.environ.get("PAYMENTS_TOKEN", "")
LOCK = threading.Lock()
ANSWERS = {}  # idempotency key -> (status, body)
CHARGES = {}  # the charge request's idempotency key -> charge id
REFUNDED = set()  # charge ids refunded
SLOW_KEYS = set()  # keys of charges that are answered late
SLOW_CENTS = int(os.environ.get("PAYMENTS_SLOW_CENTS", "6666"))
SLOW_SECONDS = float(os.environ.get("PAYMENTS_SLOW_SECONDS", "15"))
STATS = {"charges": 0, "declined": 0, "refunds": 0, "retries_deduplicated": 0, "charged_orders": {}, "late_answers": 0}


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
                result, late = ANSWERS[key], key in SLOW_KEYS
            else:
                late = False
                if self.path == "/charges":
                    if int(body.get("cents", 0)) > 10000:
                        STATS["declined"] += 1
                        result = (402, {"error": "declined: over the limit"})
                    else:
                        STATS["charges"] += 1
                        order = body.get("order_id", "")
                        STATS["charged_orders"][order] = STATS["charged_orders"].get(order, 0) + 1
                        charge = "ch_" + uuid.uuid4().hex[:12]
                        CHARGES[key] = charge
                        result = (200, {"id": charge})
                        if int(body.get("cents", 0)) == SLOW_CENTS:
                            SLOW_KEYS.add(key)
                            late = True
                elif self.path == "/refunds":
                    charge = CHARGES.get(body.get("charge_key", ""))
                    if charge and charge not in REFUNDED:
                        REFUNDED.add(charge)
                        STATS["refunds"] += 1
                    result = (200, {"ok": True, "refunded": charge})
                else:
                    result = (404, {"error": "not found"})
                ANSWERS[key] = result
            if late:
                STATS["late_answers"] += 1
        if late:
            time.sleep(SLOW_SECONDS)  # acted, answers too late
        try:
            return self.answer(*result)
        except (BrokenPipeError, ConnectionResetError):
            return None  # the caller gave up waiting


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8099
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
