"""What the real tools make of taper's exports (tests/interop.rs runs it in
the test virtualenv that scripts/fetch-data.sh makes). Prints JSON.

    python interop_check.py batch CALLS_JSON
        each call of the file's JSON list of argument lists (each as this
        script takes them) in one process, the tools imported once: the list
        of their results
    python interop_check.py hf-random DIR VOCAB CONTEXT WIDTH LAYERS HEADS
        transformers saves a randomly initialised GPT-2 (seed 0) to DIR
    python interop_check.py hf-logits DIR IDS_JSON
        transformers loads DIR and gives the logits of the ids (one sequence)
    python interop_check.py hf-tokenize DIR TEXT
        the ids DIR's tokenizer.json gives the text (transformers' fast tokenizer)
    python interop_check.py pipeline-scores DIR TEXTS_JSON
        transformers' text-classification pipeline over DIR with every label's
        score (`top_k=None`: a softmax over classes, or each label's sigmoid for a
        multi-label classifier's `problem_type`), and the config's problem_type
    python interop_check.py llama MODEL.gguf IDS_JSON [--lora ADAPTER.gguf] [--text TEXT] [--kv f32]
        llama.cpp (PyPI llama-cpp-python, built from its sdist) loads the model (and the
        adapter) and gives the mean cross-entropy of each next id, the
        per-position cross-entropies, each position's log-probabilities of
        the sequence's ids (`logprobs`, a row per position), and its
        tokenization of TEXT
    python interop_check.py onnx-logits MODEL.onnx INPUT_JSON
        onnx's checker passes the model (full check, with shape inference) and
        onnxruntime gives the logits of the input (a file holding
        {"shape": [...], "data": [...]}), with the model's metadata
    python interop_check.py onnx-classify MODEL.onnx FOLDER
        onnxruntime classifies an image folder as a user would: each image read
        with Pillow as the model's `taper.image_input` says (resized to its
        size, grey or RGB, bytes / scale), the classes from its
        `taper.classes`; prints the accuracy against the folder's labels and
        the number of images
    python interop_check.py numpy-write DIR
        NumPy writes samples as users save them: x (f32 [300, 4]), y (int64
        classes, a linear function of x), mass (f64, another) and pixels (u8
        [300, 2, 2]) as .npy files (format 1, and x in format 2 as x2.npy),
        in data.npz (np.savez) and packed.npz (np.savez_compressed); the
        same arrays through safetensors' numpy API in same.safetensors; and
        files taper refuses: big-endian, Fortran-order, string labels
    python interop_check.py onnx-samples MODEL.onnx FILE.safetensors X Y
        onnxruntime on a safetensors file's samples as a user would: tensor X
        (named in the model's `taper.array_input`) as f32, u8 divided by its
        scale (the graph standardizes it); against
        tensor Y, the accuracy (integer labels) or RMSE, MAE and R² (numbers:
        a regression; for a Y of [n, k], each target's and their means), in
        NumPy, f64
    python interop_check.py bert-classifier BERT_DIR OUT_DIR LABELS TEXTS_JSON [MAX_LENGTH]
        a BertForSequenceClassification of LABELS classes over the BERT in
        BERT_DIR (its head drawn from seed 0, times 50), saved to OUT_DIR: the ids of
        the texts (strings, or [a, b] pairs), cut at MAX_LENGTH (128) and padded as
        a batch, their token types and attention mask, and its logits
    python interop_check.py classifier-random FAMILY OUT_DIR LABELS TEXTS_JSON CORPUS_CSV [MAX_LENGTH]
        a small DistilBertForSequenceClassification or RobertaForSequenceClassification
        (FAMILY distilbert or roberta; 2 blocks, width 32, seed 0, weights of standard
        deviation 0.4, norms and biases drawn away from 1 and 0) saved to OUT_DIR with a real tokenizer: for
        DistilBERT, MiniLM's (bert-base-uncased's vocabulary, as distilbert-base-uncased
        has), from the folder beside CORPUS_CSV's ../minilm; for RoBERTa, a byte-level
        BPE of 400 ids trained by tokenizers on the CSV's `text` column, with
        RoBERTa's special tokens and template. The texts' (or [a, b] pairs') ids, cut
        at MAX_LENGTH (24), padded as a batch, and the logits
    python interop_check.py parquet-write CSV OUT COMPRESSION
        pandas reads the CSV and writes it to OUT as Parquet (pyarrow, COMPRESSION:
        snappy, zstd, gzip, lz4 or none)
    python interop_check.py parquet-lists OUT
        a Parquet file with a list column of label ids per row, as Hugging Face
        datasets keep multi-label data
    python interop_check.py embeddings DIR
        train and test tables of 32-number embeddings a row, as Hugging Face
        datasets keep them: DIR/{train,test}.{parquet,jsonl} (a list column)
        and .csv (a column per number); NumPy's nearest-centroid accuracy
    python interop_check.py json-write CSV OUT LAYOUT
        pandas reads the CSV and writes it to OUT as JSON records (LAYOUT lines:
        JSON Lines, as Hugging Face datasets' to_json writes them; array: one
        JSON array of objects)
    python interop_check.py shards CSV DIR N
        pandas reads the CSV and writes its rows in N consecutive parts into
        DIR, each as CSV (part-K.csv), Parquet (train-0000K-of-0000N.parquet,
        as Hugging Face names a dataset's shards) and JSON Lines
        (part-K.jsonl, every other part with its columns reversed)
    python interop_check.py json-lists OUT
        parquet-lists' table as JSON Lines
    python interop_check.py label-sets CSV COLUMN SEP
        pandas' str.get_dummies(SEP) of the CSV's COLUMN of label sets: the
        labels and each row's 0s and 1s
    python interop_check.py legacy-weights DIR KIND [SHARD_SIZE]
        rewrites the model folder DIR's weights (its config's class) as transformers
        once saved them (KIND pickle: PyTorch's pytorch_model.bin, no
        model.safetensors) or as a large model's are (KIND shards: safetensors shards
        of SHARD_SIZE, 200KB unless given, and their index)
    python interop_check.py bert-logits DIR IDS_JSON
        the logits of the sequence classifier (a BERT, DistilBERT or RoBERTa) in DIR for padded
        ids (a mask from its pad token id)
    python interop_check.py bert-dropout DIR IDS_JSON DRAWS CLASSIFIER_DROPOUT
        the mean and standard deviation of each logit of the
        BertForSequenceClassification in DIR over DRAWS passes in training
        mode (its config's dropout; the pooled output's at CLASSIFIER_DROPOUT),
        flattened
    python interop_check.py gpt2-dropout DIR IDS_JSON DRAWS
        the mean and standard deviation of each logit of the GPT-2 in DIR
        over DRAWS passes in training mode (its config's dropout)
    python interop_check.py bert-pipeline DIR TEXTS_JSON
        transformers' text-classification pipeline over the classifier
        folder DIR: the texts' ids padded as a batch, the model's logits,
        and the pipeline's top label for each
    python interop_check.py peft-chat MODEL.gguf TOKENIZER ADAPTER_DIR MESSAGE REPLY
        transformers and PEFT run the GGUF model with a PEFT adapter folder:
        the greedy replies to MESSAGE with and without it, and the
        log-probabilities of the conversation with REPLY
"""
import ctypes
import json
import math
import sys


def hf_random(d, vocab, context, width, layers, heads):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    c = GPT2Config(vocab_size=vocab, n_positions=context, n_embd=width, n_layer=layers,
                   n_head=heads, bos_token_id=None, eos_token_id=None)
    m = GPT2LMHeadModel(c)
    # Non-trivial norms and biases, so that a swapped or untransposed
    # weight shows in the logits.
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    m.save_pretrained(d)
    print(json.dumps({"saved": d}))


def hf_logits(d, ids):
    import torch
    from transformers import GPT2LMHeadModel

    m = GPT2LMHeadModel.from_pretrained(d, torch_dtype=torch.float64).eval()
    with torch.no_grad():
        out = m(torch.tensor([ids])).logits[0]
    print(json.dumps({"logits": out.tolist()}))


def hf_tokenize(d, text):
    from transformers import PreTrainedTokenizerFast

    t = PreTrainedTokenizerFast(tokenizer_file=f"{d}/tokenizer.json")
    print(json.dumps({"ids": t(text)["input_ids"]}))


def bert_classifier(d, out, labels, texts, max_length=128):
    """A classifier over the BERT at `d` saved to `out`, and its logits for
    `texts`: strings, or [a, b] pairs (tokenized as tokenizer(a, b))."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(0)
    m = BertForSequenceClassification.from_pretrained(d, num_labels=labels).eval()
    with torch.no_grad():  # logits of order 1, so that differences show
        m.classifier.weight.mul_(50)
    m.save_pretrained(out)
    t = AutoTokenizer.from_pretrained(d)
    t.save_pretrained(out)
    given = [[p[0] for p in texts], [p[1] for p in texts]] if isinstance(texts[0], list) else [texts]
    batch = t(*given, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        logits = m.double()(**batch).logits
    print(json.dumps({"ids": batch["input_ids"].tolist(), "types": batch["token_type_ids"].tolist(),
                      "mask": batch["attention_mask"].tolist(), "logits": logits.tolist()}))


def roberta_tokenizer(corpus_csv):
    """A RoBERTa tokenizer (byte-level BPE, `<s>` `<pad>` `</s>` `<unk>`
    `<mask>` as ids 0-4, `<s> a </s></s> b </s>` for pairs) trained on the
    CSV's `text` column."""
    import csv

    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import RobertaTokenizerFast

    with open(corpus_csv, newline="") as f:
        texts = [row["text"] for row in csv.DictReader(f)][:400]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=400, min_frequency=2,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                sep_token="</s>", cls_token="<s>", unk_token="<unk>",
                                pad_token="<pad>", mask_token="<mask>")


def classifier_random(family, out, labels, texts, corpus_csv, max_length=24):
    import os

    import torch
    from transformers import (AutoTokenizer, DistilBertConfig, DistilBertForSequenceClassification,
                              RobertaConfig, RobertaForSequenceClassification)

    torch.manual_seed(0)
    if family == "distilbert":
        t = AutoTokenizer.from_pretrained(os.path.join(os.path.dirname(corpus_csv), "..", "minilm"))
        c = DistilBertConfig(vocab_size=t.vocab_size, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                             max_position_embeddings=64, num_labels=labels, initializer_range=0.4,
                             pad_token_id=t.pad_token_id)
        m = DistilBertForSequenceClassification(c)
    else:
        t = roberta_tokenizer(corpus_csv)
        c = RobertaConfig(vocab_size=len(t), hidden_size=32, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=64,
                          max_position_embeddings=max_length + 2, type_vocab_size=1,
                          layer_norm_eps=1e-5, num_labels=labels, pad_token_id=1, initializer_range=0.4,
                          bos_token_id=0, eos_token_id=2)
        m = RobertaForSequenceClassification(c)
    # The longest text the model takes, as a real checkpoint's tokenizer says.
    t.model_max_length = c.max_position_embeddings - (2 if family == "roberta" else 0)
    with torch.no_grad():  # norms and biases away from 1 and 0
        for name, p in m.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.3)
    m.eval().save_pretrained(out)
    t.save_pretrained(out)
    given = [[p[0] for p in texts], [p[1] for p in texts]] if isinstance(texts[0], list) else [texts]
    batch = t(*given, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    batch.pop("token_type_ids", None)
    with torch.no_grad():
        logits = m.double()(**batch).logits
    print(json.dumps({"ids": batch["input_ids"].tolist(), "mask": batch["attention_mask"].tolist(),
                      "pad": t.pad_token_id, "logits": logits.tolist()}))


def legacy_weights(d, kind, shard_size="200KB"):
    import os

    import torch
    import transformers

    with open(os.path.join(d, "config.json")) as f:
        cls = getattr(transformers, json.load(f)["architectures"][0])
    m = cls.from_pretrained(d)
    os.remove(os.path.join(d, "model.safetensors"))
    if kind == "pickle":
        torch.save(m.state_dict(), os.path.join(d, "pytorch_model.bin"))
    else:
        m.save_pretrained(d, max_shard_size=shard_size)
    print(json.dumps({"files": sorted(os.listdir(d))}))


def bert_logits(d, ids):
    import torch
    from transformers import AutoModelForSequenceClassification

    m = AutoModelForSequenceClassification.from_pretrained(d, torch_dtype=torch.float64).eval()
    ids = torch.tensor(ids)
    with torch.no_grad():
        logits = m(input_ids=ids, attention_mask=(ids != m.config.pad_token_id).long()).logits
    print(json.dumps({"logits": logits.tolist()}))


def bert_dropout(d, ids, draws, classifier_dropout):
    """The mean and standard deviation of each logit over `draws` forward
    passes in training mode (dropout at the config's rates, the pooled
    output's at `classifier_dropout`), each pass its own masks (draws_of)."""
    import torch
    from transformers import BertForSequenceClassification

    m = BertForSequenceClassification.from_pretrained(
        d, torch_dtype=torch.float64, classifier_dropout=classifier_dropout).train()
    ids = torch.tensor(ids)
    mask = (ids != m.config.pad_token_id).long()
    outs = draws_of(lambda k: m(input_ids=ids.repeat(k, 1), attention_mask=mask.repeat(k, 1)).logits,
                    draws)
    print(json.dumps(spread(outs)))


def draws_of(forward, draws, chunk=50):
    """`draws` outputs of a batch in training mode, each under masks of its
    own: `forward(k)` runs k copies of the batch stacked along its first
    dimension (dropout draws each element's mask independently, so each
    copy is a draw of its own), `chunk` copies at a time; seeded."""
    import torch

    outs = []
    with torch.no_grad():
        for i in range(0, draws, chunk):
            k = min(chunk, draws - i)
            torch.manual_seed(i)
            out = forward(k)
            outs.extend(out.reshape(k, out.shape[0] // k, *out.shape[1:]).unbind(0))
    return outs


def spread(outs):
    """Each value's mean and standard deviation over the passes `outs`,
    flattened."""
    import torch

    o = torch.stack(outs).flatten(1)
    return {"mean": o.mean(0).tolist(), "sd": o.std(0).tolist()}


def gpt2_dropout(d, ids, draws):
    """The mean and standard deviation of each logit of the GPT-2 in `d`
    for `ids` over `draws` passes in training mode (its config's dropout),
    each pass its own masks (draws_of)."""
    import torch
    from transformers import GPT2LMHeadModel

    m = GPT2LMHeadModel.from_pretrained(d, torch_dtype=torch.float64).train()
    ids = torch.tensor([ids])
    print(json.dumps(spread(draws_of(lambda k: m(ids.repeat(k, 1)).logits, draws))))


def bert_pipeline(d, texts):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    t = AutoTokenizer.from_pretrained(d)
    m, info = AutoModelForSequenceClassification.from_pretrained(
        d, torch_dtype=torch.float64, output_loading_info=True)
    m.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    batch = t(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        logits = m(**batch).logits
    labels = [r["label"] for r in pipeline("text-classification", model=d)(texts)]
    print(json.dumps({"ids": batch["input_ids"].tolist(), "logits": logits.tolist(),
                      "labels": labels}))


def pipeline_scores(d, texts):
    from transformers import AutoConfig, pipeline

    scores = pipeline("text-classification", model=d, top_k=None)(texts)
    print(json.dumps({"scores": [{s["label"]: s["score"] for s in row} for row in scores],
                      "problem_type": AutoConfig.from_pretrained(d).problem_type}))


def llama(model, ids, lora=None, text=None, kv="f16"):
    import llama_cpp as L

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    m = L.llama_model_load_from_file(model.encode(), mp)
    if not m:
        raise SystemExit(f"llama.cpp could not load {model}")
    vocab = L.llama_model_get_vocab(m)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    n = len(ids)
    cp = L.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = max(n, 32)
    cp.n_threads = cp.n_threads_batch = 2
    if kv == "f32":  # llama.cpp keeps K and V in f16 by default
        cp.type_k = cp.type_v = 0  # GGML_TYPE_F32
        cp.flash_attn_type = 0  # disabled: flash attention rounds Q to f16 too
    ctx = L.llama_init_from_model(m, cp)
    if lora:
        adapter = L.llama_adapter_lora_init(m, lora.encode())
        if not adapter:
            raise SystemExit(f"llama.cpp refused the adapter {lora}")
        adapters = (L.llama_adapter_lora_p_ctypes * 1)(adapter)
        scales = (ctypes.c_float * 1)(1.0)
        if L.llama_set_adapters_lora(ctx, adapters, 1, scales) != 0:
            raise SystemExit("llama_set_adapters_lora failed")
    batch = L.llama_batch_init(n, 0, 1)
    batch.n_tokens = n
    for i, tok in enumerate(ids):
        batch.token[i] = tok
        batch.pos[i] = i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = 1
    if L.llama_decode(ctx, batch) != 0:
        raise SystemExit("llama_decode failed")
    ces, logprobs = [], []
    for i in range(n):
        row = L.llama_get_logits_ith(ctx, i)
        logits = [row[j] for j in range(n_vocab)]
        top = max(logits)
        lse = top + math.log(sum(math.exp(x - top) for x in logits))
        logprobs.append([logits[t] - lse for t in ids])
        if i + 1 < n:
            ces.append(lse - logits[ids[i + 1]])
    L.llama_batch_free(batch)
    out = {"ce": sum(ces) / len(ces), "ces": ces, "logprobs": logprobs, "n_vocab": n_vocab}
    if text is not None:
        raw = text.encode()
        buf = (L.llama_token * (len(raw) + 8))()
        k = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, False)
        out["tokens"] = list(buf[:k])
    print(json.dumps(out))


def onnx_logits(model, input_json):
    import numpy as np
    import onnx
    import onnxruntime as ort

    m = onnx.load(model)
    onnx.checker.check_model(m, full_check=True)
    with open(input_json) as f:
        x = json.load(f)
    x = np.asarray(x["data"], dtype=np.float32).reshape(x["shape"])
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    logits = s.run(["logits"], {"input": x})[0]
    meta = {p.key: p.value for p in m.metadata_props}
    print(json.dumps({"logits": logits.tolist(), "metadata": meta, "opset": m.opset_import[0].version}))


def onnx_classify(model, folder):
    import os

    import numpy as np
    import onnx
    import onnxruntime as ort
    from PIL import Image

    meta = {p.key: p.value for p in onnx.load(model).metadata_props}
    classes = json.loads(meta["taper.classes"])
    read = json.loads(meta["taper.image_input"])
    (h, w), channels, scale = read["size"], read["channels"], read["scale"]
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    xs, ys = [], []
    for label, name in enumerate(classes):
        d = os.path.join(folder, name)
        for f in sorted(os.listdir(d)):
            img = Image.open(os.path.join(d, f)).convert("RGB")
            if img.size != (w, h):
                img = img.resize((w, h), Image.BILINEAR)
            if channels == 1:
                img = img.convert("L")
            img = np.asarray(img, dtype=np.float32) / scale
            xs.append(img[None] if channels == 1 else img.transpose(2, 0, 1))
            ys.append(label)
    logits = s.run(["logits"], {"input": np.stack(xs)})[0]
    pred, y = logits.argmax(1), np.asarray(ys)
    right = int((pred == y).sum())
    # The confusion matrix and scikit-learn's macro F1 and balanced accuracy
    # over it (classes that are labels or predictions; 0 for 0/0).
    k = len(classes)
    conf = np.zeros((k, k), dtype=np.int64)
    np.add.at(conf, (y, pred), 1)
    tp, support, predicted = np.diag(conf).astype(float), conf.sum(1), conf.sum(0)
    precision = np.where(predicted > 0, tp / np.maximum(predicted, 1), 0.0)
    recall = np.where(support > 0, tp / np.maximum(support, 1), 0.0)
    both = precision + recall
    f1 = np.where(both > 0, 2 * precision * recall / np.where(both > 0, both, 1), 0.0)
    print(
        json.dumps(
            {
                "accuracy": right / len(ys),
                "images": len(ys),
                "classes": classes,
                "confusion": conf.tolist(),
                "macro_f1": float(f1[(support + predicted) > 0].mean()),
                "balanced_accuracy": float(recall[support > 0].mean()),
            }
        )
    )


def table_x(df, table):
    """A CSV run's ONNX input from pandas' frame: its columns in order, each
    column of categories one-hot encoded by pandas' get_dummies with the run's
    categories, and the input names checked against taper's."""
    import numpy as np
    import pandas as pd

    cols = table["columns"]
    cats = table.get("categories") or [None] * len(cols)
    parts = []
    for c, k in zip(cols, cats):
        if k is None:
            parts.append(df[[c]].astype(np.float64))
        else:
            values = pd.Categorical(df[c].astype(str), categories=k)
            parts.append(pd.get_dummies(values, prefix=c, dtype=np.float64).set_index(df.index))
    x = pd.concat(parts, axis=1)
    if "inputs" in table:
        assert list(x.columns) == table["inputs"], (list(x.columns), table["inputs"])
    return x.to_numpy(np.float32)


def parquet_write(csv_path, out, compression):
    """pandas reads the CSV and writes it as Parquet (pyarrow) with
    `compression`; a missing value becomes a null."""
    import pandas as pd

    df = pd.read_csv(csv_path)
    df.to_parquet(out, compression=compression)
    print(json.dumps({"rows": len(df), "columns": list(df.columns),
                      "dtypes": [str(t) for t in df.dtypes]}))


def lists_frame():
    """A Hugging Face datasets-style table: two features, and `labels`, a
    list of label ids per row (GoEmotions' layout)."""
    import pandas as pd

    return pd.DataFrame({
        "x1": [0.5, 1.5, -2.0, 3.25],
        "x2": [1, 2, 3, 4],
        "labels": [[2, 27], [10], [], [27, 2, 10]],
    })


def parquet_lists(out):
    """lists_frame() written as Parquet by pandas."""
    df = lists_frame()
    df.to_parquet(out)
    print(json.dumps({"rows": len(df)}))


def embeddings(out):
    """A Hugging Face datasets-style table of sentence embeddings, train and
    test: `text`, `embedding` (a float32 list of 32 a row, each its class's
    centre plus noise) and `label` (a class name). pandas writes it as
    Parquet and as JSON Lines (with 15 decimals: its default of 10 rounds
    small float32s), as CSV with the list column as `to_csv` writes it (an
    array's repr; a list of floats), and as CSV with the embeddings stacked by NumPy into a
    column per item, `embedding[0]` ... `embedding[31]`; the test split's
    embeddings cut to 24 and lengthened to 40 as Parquet too. Prints the test
    accuracy of NumPy's nearest-centroid classifier fitted on train, a
    reference."""
    import os

    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(7)
    classes = np.array(["music", "science", "sports"])
    centres = rng.normal(size=(3, 32))
    accuracy = None
    fitted = None
    for split, n in [("train", 600), ("test", 200)]:
        y = rng.integers(0, 3, n)
        x = (centres[y] + rng.normal(scale=2.0, size=(n, 32))).astype(np.float32)
        texts = [f"{split} passage {i}" for i in range(n)]
        df = pd.DataFrame({"text": texts, "embedding": list(x), "label": classes[y]})
        df.to_parquet(os.path.join(out, f"{split}.parquet"))
        df.to_json(os.path.join(out, f"{split}.jsonl"), orient="records", lines=True,
                   double_precision=15)
        stacked = pd.DataFrame(np.stack(df["embedding"]),
                               columns=[f"embedding[{i}]" for i in range(32)])
        pd.concat([df[["text"]], stacked, df[["label"]]], axis=1).to_csv(
            os.path.join(out, f"{split}.csv"), index=False)
        # As pandas writes the list column itself: each array's NumPy repr,
        # and a list of Python floats.
        df.to_csv(os.path.join(out, f"{split}.arrays.csv"), index=False)
        df.assign(embedding=[v.tolist() for v in x]).to_csv(
            os.path.join(out, f"{split}.floats.csv"), index=False)
        if split == "test":
            # Embeddings of another length than the run's: 24 and 40.
            for name, v in [("short", x[:, :24]), ("long", np.hstack([x, x[:, :8]]))]:
                df.assign(embedding=list(v)).to_parquet(
                    os.path.join(out, f"test.{name}.parquet"))
        if fitted is None:
            fitted = np.stack([x[y == k].mean(0) for k in range(3)])
        else:
            d = ((x[:, None, :] - fitted[None]) ** 2).sum(-1)
            accuracy = float((d.argmin(1) == y).mean())
    print(json.dumps({"nearest_centroid_accuracy": accuracy}))


def json_write(csv_path, out, layout):
    """pandas reads the CSV and writes it as JSON records, one object a row:
    JSON Lines (`layout` lines, Hugging Face datasets' `to_json`, which
    calls pandas' with these options) or one array; a missing value becomes
    a null."""
    import pandas as pd

    df = pd.read_csv(csv_path)
    df.to_json(out, orient="records", lines=layout == "lines", force_ascii=False)
    print(json.dumps({"rows": len(df), "columns": list(df.columns)}))


def shards(csv_path, out, n):
    """pandas reads the CSV and writes its rows in `n` consecutive parts, each
    as CSV, Parquet (named as Hugging Face names a dataset's shards) and JSON
    Lines (every other part's columns reversed, as rows from another writer
    may order their keys)."""
    import os

    import numpy as np
    import pandas as pd

    df = pd.read_csv(csv_path)
    n = int(n)
    for k, part in enumerate(np.array_split(np.arange(len(df)), n)):
        rows = df.iloc[part]
        rows.to_csv(os.path.join(out, f"part-{k}.csv"), index=False)
        rows.to_parquet(os.path.join(out, f"train-{k:05d}-of-{n:05d}.parquet"))
        keys = rows[rows.columns[::-1]] if k % 2 else rows
        keys.to_json(os.path.join(out, f"part-{k}.jsonl"), orient="records", lines=True)
    print(json.dumps({"rows": len(df), "parts": n,
                      "species": [sorted(df.iloc[p]["species"].unique()) for p in np.array_split(np.arange(len(df)), n)]}))


def json_lists(out):
    """lists_frame() written as JSON Lines by pandas."""
    df = lists_frame()
    df.to_json(out, orient="records", lines=True)
    print(json.dumps({"rows": len(df)}))


def csv_lists(out):
    """lists_frame() written as CSV by pandas: each list as Python writes
    it, `[2, 27]`."""
    df = lists_frame()
    df.to_csv(out, index=False)
    print(json.dumps({"rows": len(df)}))


def csv_summarized(out):
    """A column of 1001-number arrays written as CSV by pandas: NumPy's repr
    of each summarizes it, `[0. 1. 2. ... 998. 999. 1000.]`."""
    import numpy as np
    import pandas as pd

    df = pd.DataFrame({"x": [np.arange(1001.0), np.ones(1001)], "label": [0, 1]})
    df.to_csv(out, index=False)
    print(json.dumps({"rows": len(df)}))


def label_sets(path, column, sep):
    """pandas reads the CSV and splits its column of label sets with
    `str.get_dummies(sep)` (a missing cell: no label): the labels' names, in
    its order, and each row's 0s and 1s."""
    import pandas as pd

    dummies = pd.read_csv(path)[column].str.get_dummies(sep)
    print(json.dumps({"columns": list(dummies.columns), "values": dummies.to_numpy().tolist()}))


def csv_dummies(path, label, features, categorical):
    """pandas reads the CSV, drops rows missing a used value and one-hot encodes
    each column of categories with get_dummies (its categories, its order: by
    value for a column of numbers), in place among the features; NumPy
    standardizes the other columns (population deviation) and leaves the
    one-hot ones."""
    import numpy as np
    import pandas as pd

    features, categorical = json.loads(features), json.loads(categorical)
    df = pd.read_csv(path).dropna(subset=[label] + features)
    parts, one_hot = [], []
    for c in features:
        if c in categorical:
            parts.append(pd.get_dummies(df[c], prefix=c, dtype=np.float64))
        else:
            parts.append(df[[c]].astype(np.float32).astype(np.float64))
        one_hot += [c in categorical] * parts[-1].shape[1]
    x = pd.concat(parts, axis=1)
    v = x.to_numpy(np.float64)
    z = v.copy()
    for k, h in enumerate(one_hot):
        if not h:
            z[:, k] = (v[:, k] - v[:, k].mean()) / v[:, k].std()
    print(json.dumps({"names": list(x.columns), "x": v.tolist(), "z": z.tolist(),
                      "rows": len(df)}))


def onnx_table(model, path):
    """onnxruntime on a CSV file's raw feature values, as pandas reads them."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    import pandas as pd

    m = onnx.load(model)
    onnx.checker.check_model(m, full_check=True)
    meta = {p.key: p.value for p in m.metadata_props}
    table = json.loads(meta["taper.table_input"])
    cols = table["columns"]
    df = pd.read_csv(path, sep=table["delimiter"]).dropna(subset=cols)
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    logits = s.run(["logits"], {"input": table_x(df, table)})[0]
    # Line numbers: the header is line 1.
    print(json.dumps({"logits": logits.tolist(), "lines": (df.index + 2).tolist(),
                      "classes": json.loads(meta.get("taper.classes", "null"))}))


def scores(p, t):
    """RMSE, MAE and R² of predictions `p` against targets `t` ([n] or [n,
    k]): each target's, as scikit-learn's metrics with
    multioutput="raw_values", and their means (its "uniform_average")."""
    import numpy as np

    p, t = p.reshape(len(p), -1), t.reshape(len(t), -1)
    err = p - t
    rmse = np.sqrt((err ** 2).mean(0))
    mae = np.abs(err).mean(0)
    r2 = 1 - (err ** 2).sum(0) / ((t - t.mean(0)) ** 2).sum(0)
    each = [{"rmse": float(a), "mae": float(b), "r2": float(c)} for a, b, c in zip(rmse, mae, r2)]
    return {"rmse": float(rmse.mean()), "mae": float(mae.mean()), "r2": float(r2.mean()),
            "per_target": each}


def onnx_regression(model, path, split):
    """A regression run's ONNX export on the CSV file's rows (those pandas
    keeps: a feature or a target missing drops one), its errors on the test
    rows in NumPy (f64; R² as scikit-learn's r2_score; with several targets,
    each target's and their means), and, for comparison, a least-squares
    linear model fitted to the train rows. `split` holds each part's raw
    features and targets, as taper's data gave them."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    import pandas as pd

    m = onnx.load(model)
    onnx.checker.check_model(m, full_check=True)
    meta = {p.key: p.value for p in m.metadata_props}
    table = json.loads(meta["taper.table_input"])
    target = json.loads(meta["taper.target"])
    targets = target if isinstance(target, list) else [target]
    df = pd.read_csv(path).dropna(subset=table["columns"] + targets)
    x = table_x(df, table)
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    predict = lambda x: s.run(["logits"], {"input": x})[0].astype(np.float64)
    pred = predict(x)
    split = json.load(open(split))
    part = lambda k: (np.array(split[k]["x"], np.float32), np.array(split[k]["y"], np.float64))
    (xa, ya), (xt, yt) = part("train"), part("test")
    got = scores(predict(xt), yt)
    for t, name in zip(got["per_target"], targets):
        t["target"] = name
    ones = lambda x: np.c_[x.astype(np.float64), np.ones(len(x))]
    w = np.linalg.lstsq(ones(xa), ya, rcond=None)[0]
    print(json.dumps({"pred": (pred[:, 0] if len(targets) == 1 else pred).tolist(),
                      "lines": (df.index + 2).tolist(), "test_rows": len(yt),
                      "linear": scores(ones(xt) @ w, yt), **got}))


def numpy_write(out):
    import os
    import numpy as np
    from safetensors.numpy import save_file

    r = np.random.default_rng(0)
    x = r.standard_normal((300, 4)).astype(np.float32)
    y = (x @ np.array([[1, -1, 0], [0, 1, -1], [1, 0, 1], [-1, 1, 0]], np.float32)).argmax(1).astype(np.int64)
    mass = x.astype(np.float64) @ np.array([3.0, -2.0, 0.5, 1.0]) + 5 + 0.1 * r.standard_normal(300)
    pixels = r.integers(0, 256, (300, 2, 2), dtype=np.uint8)
    arrays = {"x": x, "y": y, "mass": mass, "pixels": pixels}
    p = lambda name: os.path.join(out, name)
    for k, v in arrays.items():
        np.save(p(k + ".npy"), v)
    with open(p("x2.npy"), "wb") as f:
        np.lib.format.write_array(f, x, version=(2, 0))
    np.savez(p("data.npz"), **arrays)
    np.savez_compressed(p("packed.npz"), **arrays)
    save_file(arrays, p("same.safetensors"))
    np.save(p("big.npy"), x.astype(">f4"))
    np.save(p("fortran.npy"), np.asfortranarray(x))
    np.save(p("names.npy"), np.array(["adelie", "gentoo", "chinstrap"])[y])
    print(json.dumps({"written": sorted(os.listdir(out))}))


def onnx_samples(model, path, x_name, y_name):
    import numpy as np
    import onnx
    import onnxruntime as ort
    from safetensors.numpy import load_file

    m = onnx.load(model)
    onnx.checker.check_model(m, full_check=True)
    # How the run read its inputs: the tensor, and the divisor of bytes.
    read = json.loads({p.key: p.value for p in m.metadata_props}["taper.array_input"])
    assert read["x"] == x_name, read
    t = load_file(path)
    x, y = t[read["x"]], t[y_name]
    x = x.astype(np.float32) / (read["scale"] if x.dtype == np.uint8 else 1)
    assert list(x.shape[1:]) == read["shape"], (x.shape, read)
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    out = s.run(["logits"], {"input": x})[0].astype(np.float64)
    if np.issubdtype(y.dtype, np.integer):
        print(json.dumps({"rows": len(y), "accuracy": float((out.argmax(1) == y).mean())}))
        return
    print(json.dumps({"rows": len(y), **scores(out, y.astype(np.float64))}))


def csv_standardize(path, label, features):
    """pandas reads the CSV, drops rows missing a used value, codes the labels
    by sorted class name, and NumPy standardizes (population deviation, as
    scikit-learn's StandardScaler) the features as taper reads them (f32)."""
    import numpy as np
    import pandas as pd

    features = json.loads(features)
    df = pd.read_csv(path)
    total = len(df)
    df = df.dropna(subset=[label] + features)
    classes = sorted(df[label].unique())
    y = df[label].map({c: i for i, c in enumerate(classes)})
    x = df[features].to_numpy(np.float32).astype(np.float64)
    z = (x - x.mean(0)) / x.std(0)
    print(json.dumps({"classes": classes, "labels": y.tolist(), "dropped": total - len(df),
                      "x": z.tolist()}))


def torch_cnn(weights, spec, input_json):
    """The logits of `taper.model.cnn{...}` (`spec`, its options as JSON)
    built from PyTorch layers as the reference documents it: per channel
    count a `kernel` x `kernel` convolution (3 and padding `kernel // 2`
    unless the options say), the activation and, unless `pool` says not for
    it, a 2x2 max-pool; then flattened into the dense layers, the activation
    between them."""
    import numpy as np
    import torch
    from safetensors.torch import load_file
    from torch import nn

    w, spec = load_file(weights), json.loads(spec)
    act = {"relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU,
           "gelu": lambda: nn.GELU(approximate="tanh")}[spec["activation"]]
    k = spec.get("kernel", 3)
    pad = spec.get("padding", k // 2)
    pools = spec.get("pool") or [True] * len(spec["channels"])
    layers, (c, h, wd) = [], spec["input"]
    for i, out in enumerate(spec["channels"]):
        conv = nn.Conv2d(c, out, k, padding=pad)
        conv.load_state_dict({"weight": w[f"conv{i}.weight"], "bias": w[f"conv{i}.bias"]})
        layers += [conv, act()]
        c, h, wd = out, h + 2 * pad - k + 1, wd + 2 * pad - k + 1
        if pools[i]:
            layers.append(nn.MaxPool2d(2))
            h, wd = h // 2, wd // 2
    layers.append(nn.Flatten())
    sizes = [c * h * wd] + spec["hidden"] + [spec["outputs"]]
    for j in range(len(sizes) - 1):
        fc = nn.Linear(sizes[j], sizes[j + 1])
        fc.load_state_dict({"weight": w[f"fc{j}.weight"], "bias": w[f"fc{j}.bias"]})
        layers += [fc] + ([act()] if j + 2 < len(sizes) else [])
    with open(input_json) as f:
        x = json.load(f)
    x = torch.tensor(np.asarray(x["data"], dtype=np.float32).reshape(x["shape"]))
    with torch.no_grad():
        logits = nn.Sequential(*layers)(x)
    print(json.dumps({"logits": logits.tolist()}))


def llama_chat(model, message, lora=None):
    """llama.cpp's chat completion (the GGUF file's own chat template) of
    one user message, greedy. Prints {"reply": ...}."""
    from llama_cpp import Llama

    m = Llama(model_path=model, lora_path=lora, n_ctx=128, n_threads=2, verbose=False)
    out = m.create_chat_completion(messages=[{"role": "user", "content": message}],
                                   temperature=0, max_tokens=24)
    print(json.dumps({"reply": out["choices"][0]["message"]["content"]}))


def peft_chat(model, tokenizer, adapter, message, reply):
    """transformers reads the GGUF model (dequantized to f32) and PEFT loads
    the adapter folder over it, as a user would. Prints {"reply",
    "original"}: the greedy reply to one user message (the file's own chat
    template, up to 24 tokens or its end token) with the adapter and with it
    disabled; and {"ids", "reply_from", "logprobs", "base_logprobs"}: the
    ids of the conversation with `reply` as the assistant's, where the
    reply's start, and each position's log-probability of the next id, with
    the adapter and without."""
    import os

    import torch
    from gguf import GGUFReader
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    torch.set_num_threads(2)
    f = GGUFReader(model).fields["tokenizer.chat_template"]
    template = bytes(f.parts[f.data[0]]).decode()
    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer)
    base = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(model), gguf_file=os.path.basename(model), dtype=torch.float32)
    m = PeftModel.from_pretrained(base, adapter).eval()
    asked = [{"role": "user", "content": message}]
    prompt = tok.apply_chat_template(asked, chat_template=template, add_generation_prompt=True,
                                     tokenize=True, return_dict=True)["input_ids"]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    x = torch.tensor([prompt])

    def answer():
        out = m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=24, do_sample=False,
                         eos_token_id=end, pad_token_id=end)
        return tok.decode(out[0, len(prompt):], skip_special_tokens=True)

    ids = tok.apply_chat_template(asked + [{"role": "assistant", "content": reply}],
                                  chat_template=template, tokenize=True, return_dict=True)["input_ids"]
    y = torch.tensor([ids])

    def logprobs():
        lp = torch.log_softmax(m(input_ids=y[:, :-1]).logits.double(), -1)[0]
        return lp.gather(1, y[0, 1:, None])[:, 0].tolist()

    with torch.no_grad():
        out = {"reply": answer(), "ids": ids, "reply_from": len(prompt), "logprobs": logprobs()}
        with m.disable_adapter():
            out.update(original=answer(), base_logprobs=logprobs())
    print(json.dumps(out))


def chat_tokens(model, tokenizer, jsonl):
    """transformers' apply_chat_template over each conversation of a JSON
    Lines file (messages, or a prompt and its completion), with the model's
    own template read from its GGUF file: the ids, and the assistant mask
    that transformers gives for the same template marked with
    `{% generation %}`. Prints {"ids": [...], "mask": [...]}, one per line."""
    from gguf import GGUFReader
    from transformers import PreTrainedTokenizerFast

    f = GGUFReader(model).fields["tokenizer.chat_template"]
    template = bytes(f.parts[f.data[0]]).decode()
    # SmolLM2's template, the assistant's content and end marked.
    marked = template.replace(
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}",
        "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}"
        "{{ message['content'] + '<|im_end|>' + '\n' }}{% endgeneration %}{% else %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endif %}",
    )
    assert marked != template, "the template is not SmolLM2's"
    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer)
    ids, masks = [], []
    for line in open(jsonl, encoding="utf-8"):
        if not line.strip():
            continue
        c = json.loads(line)
        messages = c.get("messages") or c["prompt"] + c["completion"]
        plain = tok.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=True)
        out = tok.apply_chat_template(messages, chat_template=marked, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        assert out["input_ids"] == plain["input_ids"], "the marked template renders another text"
        ids.append(plain["input_ids"])
        masks.append(out["assistant_masks"])
    print(json.dumps({"ids": ids, "mask": masks}))


def batch(path):
    """Each call of the JSON list in `path` (argument lists, as this script
    takes them) in this one process, so the tools are imported once; prints
    the list of their results (each call's last line of output)."""
    import contextlib
    import io

    with open(path) as f:
        calls = json.load(f)
    results = []
    for call in calls:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            run(call[0], call[1:])
        results.append(json.loads(out.getvalue().splitlines()[-1]))
    print(json.dumps(results))


def main():
    run(sys.argv[1], sys.argv[2:])


def run(cmd, args):
    if cmd == "batch":
        batch(args[0])
    elif cmd == "hf-random":
        hf_random(args[0], *map(int, args[1:6]))
    elif cmd == "hf-logits":
        hf_logits(args[0], json.loads(args[1]))
    elif cmd == "hf-tokenize":
        hf_tokenize(args[0], args[1])
    elif cmd == "bert-classifier":
        bert_classifier(args[0], args[1], int(args[2]), json.loads(args[3]), *map(int, args[4:5]))
    elif cmd == "classifier-random":
        classifier_random(args[0], args[1], int(args[2]), json.loads(args[3]), args[4],
                          *(int(a) for a in args[5:]))
    elif cmd == "legacy-weights":
        legacy_weights(*args)
    elif cmd == "bert-logits":
        bert_logits(args[0], json.loads(args[1]))
    elif cmd == "bert-dropout":
        bert_dropout(args[0], json.loads(args[1]), int(args[2]), float(args[3]))
    elif cmd == "gpt2-dropout":
        gpt2_dropout(args[0], json.loads(args[1]), int(args[2]))
    elif cmd == "bert-pipeline":
        bert_pipeline(args[0], json.loads(args[1]))
    elif cmd == "pipeline-scores":
        pipeline_scores(args[0], json.loads(args[1]))
    elif cmd == "llama":
        opts = dict(zip(args[2::2], args[3::2]))
        llama(args[0], json.loads(args[1]), opts.get("--lora"), opts.get("--text"),
              opts.get("--kv", "f16"))
    elif cmd == "onnx-logits":
        onnx_logits(args[0], args[1])
    elif cmd == "onnx-classify":
        onnx_classify(args[0], args[1])
    elif cmd == "onnx-table":
        onnx_table(args[0], args[1])
    elif cmd == "onnx-regression":
        onnx_regression(args[0], args[1], args[2])
    elif cmd == "numpy-write":
        numpy_write(args[0])
    elif cmd == "onnx-samples":
        onnx_samples(args[0], args[1], args[2], args[3])
    elif cmd == "llama-chat":
        llama_chat(args[0], args[1], args[2] if len(args) > 2 else None)
    elif cmd == "peft-chat":
        peft_chat(*args[:5])
    elif cmd == "chat-tokens":
        chat_tokens(args[0], args[1], args[2])
    elif cmd == "torch-cnn":
        torch_cnn(args[0], args[1], args[2])
    elif cmd == "parquet-write":
        parquet_write(args[0], args[1], args[2])
    elif cmd == "parquet-lists":
        parquet_lists(args[0])
    elif cmd == "embeddings":
        embeddings(args[0])
    elif cmd == "json-write":
        json_write(args[0], args[1], args[2])
    elif cmd == "shards":
        shards(args[0], args[1], args[2])
    elif cmd == "json-lists":
        json_lists(args[0])
    elif cmd == "csv-lists":
        csv_lists(args[0])
    elif cmd == "csv-summarized":
        csv_summarized(args[0])
    elif cmd == "label-sets":
        label_sets(args[0], args[1], args[2])
    elif cmd == "csv-dummies":
        csv_dummies(args[0], args[1], args[2], args[3])
    elif cmd == "csv-standardize":
        csv_standardize(args[0], args[1], args[2])
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
