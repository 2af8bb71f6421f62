"""Training: a run of `keras-reluvit train` and the parts it is made of.

- `run`: the run (`build_config`, `train`: data, model, recipe, backups,
  artefacts, reruns, the run folder; `kr.build_config`, `kr.train`);
  `settings`: its typed settings, the resolved `RunConfig` and the defaults
  written once; `flags`: recipe fields from the command line (timm's and
  DeiT's names too);
- `recipes`: the recipe catalogue, `compile` and the learning-rate schedule;
  `optimizers`: the recipe optimizers (EMA, LAMB, layer decay);
  `losses`: the sigmoid and binarized cross-entropies;
- `backup`: step backups, exact resume and the SIGTERM stop (`kr.backup.fit`);
  `backup_state`: what a backup holds of the model (Orbax on JAX);
  `signals`: the signals noted before and during a run;
  `callbacks`: the callbacks a run adds (`kr.callbacks.default`);
- `finetune`: what to train of a checkpoint and at which rate;
  `fewshot`: the few-shot linear probe.
"""
