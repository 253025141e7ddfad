"""Envoy's v3 API (envoy-data-plane, generated from Envoy's own protos) parses what
`stormglass advise --format envoy` writes, strictly: an unknown field, a wrong type or a
malformed duration is an error.

Usage: envoy_config.py JSON (the advice's array of {caller, callee, routes, cluster}).
Prints JSON: per entry the routes and the cluster as Envoy read them back.
"""

import json
import sys

from envoy_data_plane.envoy.config.cluster.v3 import Cluster
from envoy_data_plane.envoy.config.route.v3 import Route


def main():
    parsed = []
    for entry in json.loads(sys.argv[1]):
        parsed.append(
            {
                "caller": entry["caller"],
                "callee": entry["callee"],
                "routes": [Route().from_dict(r).to_dict() for r in entry["routes"]],
                "cluster": Cluster().from_dict(entry["cluster"]).to_dict(),
            }
        )
    print(json.dumps(parsed))


if __name__ == "__main__":
    main()
