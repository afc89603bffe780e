"""What training and validation read: one Batch type and the samplers that give it."""
