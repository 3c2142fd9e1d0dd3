"""Vision: ViT and its successors on Fashion-MNIST / MNIST."""
