"""A job in the shape of PyTorch's DDP tutorial series' multinode.py (examples repository,
distributed/ddp-tutorial-series), on gloo and the CPU: local rank 0 of every node saves a
snapshot to `snapshot.pt` in the working directory after each epoch, and a launch that
finds one there resumes from it. Run twice, with more epochs the second time, it goes on
where the first ended: what `train` must allow, as torchrun run by hand does.

    multinode.py TOTAL_EPOCHS SAVE_EVERY [--batch_size N]
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

SNAPSHOT = "snapshot.pt"


class Trainer:
    def __init__(self, model, data, optimizer, save_every):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model, self.data, self.optimizer = model, data, optimizer
        self.save_every, self.epochs_run = save_every, 0
        if os.path.exists(SNAPSHOT):
            print("Loading snapshot", flush=True)
            snapshot = torch.load(SNAPSHOT, map_location="cpu")
            self.model.load_state_dict(snapshot["MODEL_STATE"])
            self.epochs_run = snapshot["EPOCHS_RUN"]
            print(f"Resuming training from snapshot at Epoch {self.epochs_run}", flush=True)
        self.model = DDP(self.model)

    def _run_epoch(self, epoch):
        self.data.sampler.set_epoch(epoch)
        for source, targets in self.data:
            self.optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(self.model(source), targets)
            loss.backward()
            self.optimizer.step()
        print(f"[GPU{self.global_rank}] Epoch {epoch} | Steps: {len(self.data)}", flush=True)

    def _save_snapshot(self, epoch):
        torch.save({"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch},
                   SNAPSHOT)
        print(f"Epoch {epoch} | Training snapshot saved at {SNAPSHOT}", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.local_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch + 1)


def main(total_epochs, save_every, batch_size):
    dist.init_process_group(os.environ.get("CLUSTERTRAIN_BACKEND", "gloo"))
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 20), torch.randint(0, 4, (256,)))
    model = torch.nn.Linear(20, 4)
    loader = DataLoader(data, batch_size=batch_size, sampler=DistributedSampler(data))
    Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=1e-3),
            save_every).train(total_epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", default=32, type=int)
    args = parser.parse_args()
    main(args.total_epochs, args.save_every, args.batch_size)
