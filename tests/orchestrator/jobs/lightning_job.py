"""A PyTorch Lightning script as its users write it: a LightningModule, a Trainer with
`strategy="ddp"` over `--nodes` nodes, checkpoints on the share, and the second launch
resuming from the last one (`ckpt_path="last"`). It knows nothing of clustertrain.

    lightning_job.py --nodes N --ckpt-dir DIR --epochs E
"""
import argparse

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--nodes", type=int, required=True)
parser.add_argument("--ckpt-dir", required=True)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--samples", type=int, default=1536)
args = parser.parse_args()
torch.set_num_threads(1)


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def on_train_epoch_start(self) -> None:
        if self.global_rank == 0:
            print(f"epoch {self.current_epoch} starts", flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


generator = torch.Generator().manual_seed(0)
x = torch.randn(args.samples, 32, generator=generator)
y = x.sum(dim=1, keepdim=True)
data = DataLoader(TensorDataset(x, y), batch_size=16)
trainer = L.Trainer(num_nodes=args.nodes, devices=1, accelerator="cpu", strategy="ddp",
                    max_epochs=args.epochs, logger=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=args.ckpt_dir,
                    callbacks=[ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True)])
trainer.fit(Regression(), data, ckpt_path="last")
if trainer.global_rank == 0:
    print(f"trained to epoch {trainer.current_epoch}", flush=True)
