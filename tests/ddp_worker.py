"""Worker for tests/test_learner.py::test_ddp_two_process_gloo, started by torchrun (one process per rank)."""
import os, sys
import torch
import torch.distributed as dist
from pe_anchors.learner import train

if __name__ == '__main__':
    out = sys.argv[1]
    res = train('rpt', 'digits', epochs=1, bs=32, model_kwargs=dict(depth=1), show_progress=False, run_dir=f'{out}/run')
    learn = res['learn']
    torch.save(dict(sd=learn.model.state_dict(), n_iter=len(learn.dls.train), acc=res['accuracy'],
                    world=dist.get_world_size(), idxs=learn.dls.train.get_idxs()[:5]),
               f"{out}/rank{os.environ['RANK']}.pt")
    dist.destroy_process_group()
