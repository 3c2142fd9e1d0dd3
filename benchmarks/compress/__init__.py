"""Model compression: head pruning, distillation, their speed."""
