"""A local stand-in for the AWS JSON-protocol APIs moto 5.2.5 does not implement, driven through
real boto3 (point it here with AWS_ENDPOINT_URL_PRICING / AWS_ENDPOINT_URL_CE):

- the Price List API (`pricing` GetProducts): it answers the product documents of `products`
  whose attributes match every TERM_MATCH filter of the request, as the real API does (the
  documents are JSON strings in `PriceList`);
- Cost Explorer's UpdateCostAllocationTagsStatus (`tag_errors` makes a key fail the way AWS
  answers a tag it has not seen on any resource yet).

Every request is kept in `calls` as (target, body); the server checks that boto3 signed it
(SigV4 Authorization header) and sent the JSON 1.1 content type."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def product(
    service: str,
    attributes: dict[str, str],
    unit: str,
    amount: float,
    currency: str = "USD",
    tiers: list[tuple[str, float]] | None = None,
) -> dict[str, Any]:
    """One Price List product document with an OnDemand term; `tiers`: (beginRange, amount)."""
    sku = (
        "SKU"
        + hashlib.sha1(json.dumps([service, attributes], sort_keys=True).encode())
        .hexdigest()[:12]
        .upper()
    )
    dims = {}
    for i, (begin, price) in enumerate(tiers or [("0", amount)]):
        dims[f"{sku}.JRTCKXETXF.{i}"] = {
            "unit": unit,
            "beginRange": begin,
            "endRange": "Inf",
            "pricePerUnit": {currency: f"{price:.10f}"},
            "description": f"{service} {attributes.get('usagetype', '')}",
        }
    return {
        "product": {
            "sku": sku,
            "productFamily": attributes.get("productFamily", ""),
            "attributes": attributes,
        },
        "serviceCode": service,
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {"sku": sku, "priceDimensions": dims}}},
        "version": "20261201000000",
        "publicationDate": "2026-12-01T00:00:00Z",
    }


class FakeAwsJson:
    def __init__(
        self,
        products: dict[str, list[dict[str, Any]]] | None = None,
        tag_errors: dict[str, str] | None = None,
    ) -> None:
        self.products = products or {}
        self.tag_errors = tag_errors or {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeAwsJson:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def targets(self) -> list[str]:
        return [t for t, _ in self.calls]

    def answer(self, target: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if target == "AWSPriceListService.GetProducts":
            wanted = {f["Field"]: f["Value"] for f in body.get("Filters", [])}
            found = [
                json.dumps(p)
                for p in self.products.get(body["ServiceCode"], [])
                if all(p["product"]["attributes"].get(k) == v for k, v in wanted.items())
            ]
            return 200, {"FormatVersion": "aws_v1", "PriceList": found}
        if target == "AWSInsightsIndexService.UpdateCostAllocationTagsStatus":
            errors = [
                {"TagKey": s["TagKey"], "Code": "TagKeysNotFoundException", "Message": msg}
                for s in body["CostAllocationTagsStatus"]
                if (msg := self.tag_errors.get(s["TagKey"]))
            ]
            return 200, {"Errors": errors}
        return 400, {"__type": "UnknownOperationException", "message": target}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = self.headers.get("X-Amz-Target", "")
                if not self.headers.get("Authorization", "").startswith("AWS4-HMAC-SHA256 "):
                    status, reply = 403, {"__type": "MissingAuthenticationToken"}
                elif self.headers.get("Content-Type") != "application/x-amz-json-1.1":
                    status, reply = 400, {"__type": "SerializationException"}
                else:
                    body = json.loads(raw or b"{}")
                    fake.calls.append((target, body))
                    status, reply = fake.answer(target, body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
