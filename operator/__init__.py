"""The Flotilla operator: RaftCluster objects reconciled into StatefulSets and membership.

Decisions live in `planner` (pure: observed state in, the next single action out), so the
Kubernetes adapter and the local adapter (`flotilla scale`) share them. Nothing here imports
kopf or kubernetes at package import: `flotilla scale` must not need them.
"""
