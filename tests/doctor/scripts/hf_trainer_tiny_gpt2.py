"""A Hugging Face Trainer on a tiny GPT-2 built in place from a config (no download, no tokenizer)."""
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.manual_seed(0)


class RandomTokens(Dataset):
    def __init__(self, n=4096, length=32, vocab=256):
        self.data = torch.randint(0, vocab, (n, length))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return {"input_ids": self.data[i], "labels": self.data[i]}


config = GPT2Config(vocab_size=256, n_positions=32, n_embd=64, n_layer=2, n_head=4)
model = GPT2LMHeadModel(config)
with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(output_dir=out, max_steps=400, per_device_train_batch_size=16, learning_rate=3e-4,
                             report_to=[], logging_steps=1000, save_strategy="no", use_cpu=True,
                             dataloader_num_workers=0, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=RandomTokens()).train()
