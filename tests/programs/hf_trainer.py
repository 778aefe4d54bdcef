"""A HuggingFace Trainer run, as fine-tuning scripts are written, on a model and data made here
(no hub): a linear regression in a torch module, 24 steps, logging every 2. Under Trainer's status
env, transformers' own KubeflowCallback reports progress and metrics (report_to="all" picks it up
from KUBEFLOW_TRAINER_SERVER_URL)."""

import gc
import os

gc.disable()  # the collector paused over the imports (README.md: CI time)
import torch
from transformers import Trainer, TrainingArguments

gc.freeze()
gc.enable()


class Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        prediction = self.linear(x).squeeze(-1)
        loss = torch.nn.functional.mse_loss(prediction, labels) if labels is not None else None
        return {"loss": loss, "logits": prediction}


class Data(torch.utils.data.Dataset):
    def __init__(self, size: int = 96):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 4, generator=generator)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0])

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return {"x": self.x[index], "labels": self.y[index]}


arguments = TrainingArguments(output_dir=os.environ.get("OUTPUT_DIR", "/tmp/hf-trainer-out"), max_steps=24,
                              per_device_train_batch_size=4, logging_steps=2, learning_rate=0.05, report_to="all",
                              save_strategy="no", use_cpu=True, disable_tqdm=True)
Trainer(model=Regression(), args=arguments, train_dataset=Data()).train()
