"""Deploying a study on several GPU nodes: Kubernetes manifests (`kubernetes`) and compose's GPU claim (`compose`).

May import the base (`errors`, `gpu`), `record` and `planning`; nothing imports it but the commands.
"""
