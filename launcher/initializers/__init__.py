"""Dataset and model initializers: STORAGE_URI -> /workspace/{dataset,model}, atomic, resumable,
verified and parallel, with progress."""
