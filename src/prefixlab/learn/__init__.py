"""Learned prefix caching (LPC): features, embedders, the continuation predictor."""
