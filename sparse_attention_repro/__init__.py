__version__ = "0.1.0"
# The public API, imported on first use so that `import sparse_attention_repro` stays light (the CLI starts fast, and
# the normalizers and the model need nothing beyond torch and numpy). The modules themselves are exported from nbs/.
_API = {
    "normalizers": ["register_normalizer", "resolve_normalizer", "get_normalizer", "check_normalizer", "NormalizerSpec",
                    "registered_normalizers", "softmax", "sparsemax", "entmax15", "entmax_alpha", "entmax_bisect", "topk_softmax",
                    "attention_density"],
    "study": ["PAPER_METHODS", "ORIGINAL_GRADIENT_VARIANTS", "CRISP_CONFIGS"],
    "model": ["ClassifierConfig", "CompactClassifier", "count_parameters"],
    "data": ["DATASETS", "load_dataset", "DataOptions", "DatasetSpec", "register_dataset", "get_dataset", "resolve_device",
             "DataUnavailableError"],
    "train": ["TrainConfig", "PROFILES", "PAPER_SIZES", "profile_config", "run_one", "run_methods", "run_study_a", "train_lockstep"],
    "crisp": ["run_crisp", "apply_crisp"],
    "stats": ["paired_tests"],
    "verdicts": ["claims_table", "analyse"],
    "report": ["make_report", "versus_report"],
    "length_tasks": ["LengthTask", "register_task", "get_task", "registered_tasks"],
    "decoder": ["DecoderConfig", "CausalDecoder"],
    "length_train": ["LengthRunConfig", "train_run", "evaluate_lengths"],
    "hf_attention": ["use_normalizer"],
}
_WHERE = {name: module for module, names in _API.items() for name in names}
__all__ = sorted(_WHERE)

def __getattr__(name):
    if name not in _WHERE: raise AttributeError(f"module 'sparse_attention_repro' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value

def __dir__(): return sorted(set(globals()) | set(__all__))
