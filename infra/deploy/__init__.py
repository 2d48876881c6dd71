"""The deploy stages behind `torchfleet up|down|status|demo` (infra/cli.py).

    preflight   preflight.py   credentials, Pulumi CLI + backend, SSH key, stack config
    provision   automation.py  pulumi up / destroy / outputs through the Automation API
    inventory   inventory.py   outputs -> inventories/<stack>/stack.yml, written atomically
    converge    converge.py    site.yml + verify.yml through ansible-runner
    readiness   readiness.py   /readyz 200 on every node, or the group's healthy count
    smoke       smoke.py       one prediction through the stack's endpoint
    summary     summary.py     endpoint, nodes, batch cap, cost per hour now, TTL left

pipeline.py strings them together; progress.py renders their events; stage.py holds the error
type and the exit codes; access.py the SSH tunnels; containers.py and demo.py the local
container nodes that stand in for a cloud in `make demo` and the end-to-end test."""
