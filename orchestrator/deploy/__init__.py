"""Deploying a study on several GPU nodes: one `ClusterEngine` (`engine`) per cluster, listed in
`engines`: Slurm (`slurm`), Kubernetes manifests (`kubernetes`) and docker compose (`compose`).

May import the base (`errors`, `gpu`), `record` and `planning`; nothing imports it but the commands.
"""
