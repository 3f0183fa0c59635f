"""ResNet-50 on ImageNet-style data with tfnet: fine-tuning over Spark, evaluation, inference
throughput, and a side-by-side comparison with native Keras. Run ``python -m
examples.resnet50.train --help``."""
