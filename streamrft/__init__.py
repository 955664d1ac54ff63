"""streamrft: reinforcement fine-tuning as an event-driven system on Kafka and S3."""
__version__ = "0.1.0"
