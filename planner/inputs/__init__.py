"""Inputs: model, training and layout specs, the layout rules, model presets and Hugging Face import, layout strings."""
