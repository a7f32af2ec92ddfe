"""Decodes messages the sinks published with the official CloudEvents SDK for Python.

Reads a JSON list of messages on stdin, each {"binding", "headers", "content_type", "key",
"body"} as a consumer received it, and prints a JSON list of the decoded events, each
{"attributes": {...}, "data": ...} (the time attribute as the SDK parsed it, in ISO 8601).

Bindings: "http" (the webhook; NATS too, whose binding names and encodes its headers as HTTP
does), "kafka" (Kafka; Redis Streams too, which has no binding and uses Kafka's names), "amqp"
(RabbitMQ headers as AMQP application properties) and "mqtt" (MQTT 5, which the SDK has no
binding for: as the MQTT binding says, every user property of a binary-mode message is an
attribute, and the SDK's event type checks them; structured messages go through the SDK's JSON
format).
"""

import json
import re
import sys

from cloudevents.core.bindings import amqp, http, kafka
from dateutil.parser import isoparse
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

ATTRIBUTE = re.compile(r"^[a-z0-9]{1,20}$")


def decode(message):
    fmt = JSONFormat()
    body = message["body"].encode("utf-8")
    headers = message["headers"]
    binding = message["binding"]
    if binding == "http":
        return http.from_http(http.HTTPMessage(headers=headers, body=body), fmt)
    if binding == "kafka":
        key = message.get("key")
        return kafka.from_kafka(
            kafka.KafkaMessage(
                headers={k: v.encode("utf-8") for k, v in headers.items()},
                key=key.encode("utf-8") if key is not None else None,
                value=body,
            ),
            fmt,
        )
    if binding == "amqp":
        return amqp.from_amqp(
            amqp.AMQPMessage(
                properties={"content-type": message["content_type"]},
                application_properties=headers,
                application_data=body,
            ),
            fmt,
        )
    if binding == "mqtt":
        if message["content_type"].startswith("application/cloudevents"):
            return fmt.read(None, body)
        bad = [k for k in headers if not ATTRIBUTE.match(k)]
        if bad:
            raise SystemExit(f"MQTT user properties that are no attribute names: {bad}")
        attributes = dict(headers)
        attributes["datacontenttype"] = message["content_type"]
        if "time" in attributes:
            attributes["time"] = isoparse(attributes["time"])
        return CloudEvent(attributes, fmt.read_data(body, message["content_type"]))
    raise SystemExit(f"unknown binding {binding!r}")


def main():
    out = []
    for message in json.load(sys.stdin):
        event = decode(message)
        attributes = {
            k: (v.isoformat() if hasattr(v, "isoformat") else v)
            for k, v in event.get_attributes().items()
        }
        out.append({"attributes": attributes, "data": event.get_data()})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
