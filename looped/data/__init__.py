"""The data pipeline: builds, ahead of training, the token shards a run trains on.  It reads a
corpus (`corpus`, with `containers` for the files the prose corpus ships in), trains or loads a
tokenizer (`tokenizers`), packs documents into rows and writes them as checksummed shards
(`packing`); `dataset` builds a preset's dataset once (`looped data prepare`) and reads its rows
back in a fixed order.
"""
