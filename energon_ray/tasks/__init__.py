"""Ready tasks per modality: task encoder + tokenizer + transforms (+ config in jobs/)."""
