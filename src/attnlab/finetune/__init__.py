"""How a pretrained encoder is adapted to a task: plain functions over models, tensors and
datasets (pooled features, the LP-FT probe, label cleaning, kept frozen states, distillation),
each tested alone. Nothing here knows a task, a run folder or the command line."""
