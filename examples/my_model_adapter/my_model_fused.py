"""Optional: `run my_mlp --fuse N` trains up to N trials of one width as one fused model."""

from __future__ import annotations

import copy

import torch
from my_model_adapter import MyMLPAdapter
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from torch.nn.utils.rnn import pad_sequence


class MyFusedMLPAdapter(MyMLPAdapter):
    def fuse_key(self, params):  # trials that may train fused: one width, so one weights' shape
        return params["hidden"]

    def train_fused(self, members, *, epochs, device, options):
        if len(members) == 1:  # a group of one (the last of a study) trains as `train` does
            one, alone = members[0], {"epochs": epochs, "device": device, "options": options}
            try:
                return [self.train(one.params, report=one.report, **alone)]
            except Exception as error:  # pruned, or its own error: its entry, as below
                return [error]
        runs = [Run(member, options, device) for member in members]
        x, y, split = runs[0].x, runs[0].y, options["samples"] * 4 // 5
        network = copy.deepcopy(runs[0].model).to("meta")  # the code of the network, no weights

        def member_loss(weights, x, y, mask):  # `train`'s loss: the mean over its own rows
            error = functional_call(network, weights, (x,)) - y
            return (error.square() * mask).sum() / mask.sum()

        for epoch in range(epochs):
            live = [run for run in runs if run.entry is None]  # a pruned member trains no more
            batches = {run: run.batches(split, device) for run in live}
            for step in range(max(map(len, batches.values()), default=0)):
                # The members with a batch left this epoch, padded to the largest of them.
                now = [(run, own[step]) for run, own in batches.items() if step < len(own)]
                rows = pad_sequence([batch for _, batch in now], batch_first=True)
                lengths = torch.tensor([len(batch) for _, batch in now], device=device)
                mask = (torch.arange(rows.shape[1], device=device) < lengths[:, None]).float()
                weights, _ = stack_module_state([run.model for run, _ in now])
                # One backward for all: members share no weight, so the gradient of the sum of
                # their losses with respect to member k's weights is its own loss's gradient.
                vmap(member_loss)(weights, x[rows], y[rows], mask[..., None]).sum().backward()
                for k, (run, _) in enumerate(now):  # each member's own Adam, as alone
                    for name, parameter in run.model.named_parameters():
                        parameter.grad = weights[name].grad[k]
                    run.optimizer.step()
            for run in live:
                run.report(epoch, x[split:], y[split:])
        return [run.value if run.entry is None else run.entry for run in runs]


class Run:
    """One member: what `train` draws before its first step, in the same order (the data, the
    network, then the generator that shuffles its data), its Adam, its value or its end."""

    def __init__(self, member, options, device):
        torch.manual_seed(options["seed"])
        x = torch.rand(options["samples"], 1) * 4 - 2
        y = torch.sin(3 * x) + 0.1 * torch.randn(x.shape)
        self.x, self.y, self.member = x.to(device), y.to(device), member
        hidden = member.params["hidden"]
        self.model = nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.model.to(device)
        # Its shuffling goes on from where `train`'s stands once the first weights are drawn.
        self.order = torch.Generator().set_state(torch.get_rng_state())
        lr = member.params["learning_rate"]  # `train`'s Adam: one kernel a step, N are cheap
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr, fused=True)
        self.value, self.entry = None, None

    def batches(self, split, device):
        order = torch.randperm(split, generator=self.order).to(device)
        return order.split(self.member.params["batch_size"])

    def report(self, epoch, x, y):
        with torch.no_grad():
            self.value = nn.functional.mse_loss(self.model(x), y).item()
        try:
            self.member.report(epoch, self.value)  # the pruner may stop this member here
        except Exception as error:  # optuna.TrialPruned among them: this member alone leaves
            self.entry = error


adapter = MyFusedMLPAdapter()
