#!/usr/bin/env python3
"""A shipping service for the orders example, in Python's standard library.

It has no database access. The relay's webhook sink (examples/orders/sinks.yaml)
POSTs it each shipping.requested command; it verifies the Standard Webhooks
signature, answers 202, and replies through the relay's POST /v1/events with
correlation_id = the command's id, which completes the saga's waiting step.

POST /commands -> 202 (401 on a bad or stale signature)
GET  /stats    -> what it did, for the example's summary

Environment:
  SHIPPING_WEBHOOK_SECRET  whsec_<base64>, the sink's secret_env
  RELAY_URL                e.g. http://127.0.0.1:8097
  RELAY_API_TOKEN          the relay's --api-token

The sink delivers at least once: a command delivered again gets the same
reply id (derived from the command id), which the relay writes once.
"""
import base64
import hashlib
import hmac
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = os.environ.get("SHIPPING_WEBHOOK_SECRET", "")
RELAY_URL = os.environ.get("RELAY_URL", "http://127.0.0.1:8097").rstrip("/")
RELAY_TOKEN = os.environ.get("RELAY_API_TOKEN", "")
TOLERANCE = 5 * 60  # seconds a webhook-timestamp may be off, against replays
LOCK = threading.Lock()
STATS = {"commands": 0, "duplicates": 0, "bad_signatures": 0, "replies": 0, "reply_errors": 0}
SEEN = set()

if not SECRET.startswith("whsec_"):
    sys.exit("shipping.py: SHIPPING_WEBHOOK_SECRET must be whsec_<base64>, the sink's secret")
KEY = base64.b64decode(SECRET[len("whsec_"):])


def verified(headers, body):
    """Standard Webhooks: v1,<base64 HMAC-SHA256 of "id.timestamp.body">."""
    msg_id = headers.get("webhook-id", "")
    ts = headers.get("webhook-timestamp", "")
    try:
        if abs(time.time() - int(ts)) > TOLERANCE:
            return False
    except ValueError:
        return False
    mac = hmac.new(KEY, msg_id.encode() + b"." + ts.encode() + b"." + body, hashlib.sha256)
    want = "v1," + base64.b64encode(mac.digest()).decode()
    return any(hmac.compare_digest(sig, want) for sig in headers.get("webhook-signature", "").split())


def reply(cmd):
    """POST the reply to the relay; retried, since the relay may be busy."""
    event = {
        # The same command always gets the same reply id: a retry is a no-op (200).
        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, "shipping-reply:" + cmd["id"])),
        "event_type": "shipping.scheduled",
        "aggregate_type": cmd.get("aggregate_type", ""),
        "aggregate_id": cmd.get("aggregate_id", ""),
        "correlation_id": cmd["id"],
        "causation_id": cmd["id"],
        "payload": {"ok": True, "tracking": "TRK-" + cmd["id"][:8].upper()},
    }
    # A reply is delivered only under the command's own tenant.
    if cmd.get("tenant_id"):
        event["tenant_id"] = cmd["tenant_id"]
    data = json.dumps(event).encode()
    for attempt in range(10):
        req = urllib.request.Request(RELAY_URL + "/v1/events", data=data, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": "Bearer " + RELAY_TOKEN})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                if resp.status in (200, 201):
                    with LOCK:
                        STATS["replies"] += 1
                    return
        except (urllib.error.URLError, OSError) as e:
            print("shipping.py: reply to %s: %s" % (cmd["id"], e), file=sys.stderr)
        time.sleep(min(0.2 * 2 ** attempt, 5))
    with LOCK:
        STATS["reply_errors"] += 1


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
        if self.path != "/commands":
            return self.answer(404, {"error": "not found"})
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not verified(self.headers, body):
            with LOCK:
                STATS["bad_signatures"] += 1
            return self.answer(401, {"error": "bad webhook signature"})
        cmd = json.loads(body)
        with LOCK:
            if cmd["id"] in SEEN:
                STATS["duplicates"] += 1
            SEEN.add(cmd["id"])
            STATS["commands"] += 1
        # Answer first, reply after: the relay's sink is not held while we work.
        threading.Thread(target=reply, args=(cmd,), daemon=True).start()
        return self.answer(202, {"accepted": cmd["id"]})


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8098
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
