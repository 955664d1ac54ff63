"""Stream ops' check of a group's images, before it is scored: what the trainer would otherwise
meet in the middle of a batch.

- Every trajectory's images begin with its task's (the same references, in order).
- With the run's processor (a vision-language `model.path` on this worker): each trajectory holds
  exactly the placeholder tokens its images expand to (in its prompt, or in its response where an
  observation between turns showed them, masked 0), and none is trained.
- Every image is in the run's store and is what its reference says: the bytes hash to its sha256,
  decode as its format at its size, within the limits (`infra.media`; fetched once into this
  worker's cache).
- A run whose model is a text model (its `model.path` has no vision tower) takes no images.

Each failure is an `InvalidRollout` naming the field, so the record becomes a dead letter.
"""
from __future__ import annotations

from pathlib import Path

from streamrft.infra.media import MediaError
from streamrft.schemas import ImageRef, RolloutGroup
from streamrft.stream_ops.validate import InvalidRollout


class ImageCheck:
    def __init__(self, media, processor=None, text_model: bool = False):
        self.media, self.processor, self.text_model = media, processor, text_model
        self.image_id = None if processor is None else processor.image_token_id

    def placeholders(self, ref: ImageRef) -> int:
        """How many placeholder tokens the processor expands an image of this size into."""
        from streamrft.engine.vlm import placeholders_per_image

        return placeholders_per_image(self.processor, ref.width, ref.height)

    def __call__(self, group: RolloutGroup) -> None:
        task_images = group.task.images
        if not task_images and not any(t.images for t in group.trajectories):
            return
        if self.text_model:
            raise InvalidRollout("task.images", "this run's model is a text model: it takes no images")
        for i, t in enumerate(group.trajectories):
            if t.images[: len(task_images)] != task_images:
                raise InvalidRollout(f"trajectories.{i}.images", "must begin with the task's images")
            if self.image_id is not None:
                if any(tok == self.image_id and m for tok, m in zip(t.response_ids, t.mask())):
                    raise InvalidRollout(f"trajectories.{i}.response_ids", "an image placeholder is trained (mask 1)")
                want = sum(self.placeholders(r) for r in t.images)
                got = t.prompt_ids.count(self.image_id) + t.response_ids.count(self.image_id)
                if got != want:
                    raise InvalidRollout(f"trajectories.{i}.prompt_ids",
                                         f"{got} image placeholders for {len(t.images)} image(s) of {want} in all")
        seen = set()
        for where, refs in (("task.images", task_images),
                            *((f"trajectories.{i}.images", t.images) for i, t in enumerate(group.trajectories))):
            for k, ref in enumerate(refs):
                if ref.sha256 in seen:
                    continue
                try:
                    self.media.get(ref)
                except MediaError as e:
                    raise InvalidRollout(f"{where}.{k}.{e.field}", e.reason) from None
                seen.add(ref.sha256)


def image_check(cfg) -> ImageCheck:
    """The worker's check for `cfg`'s run: with the processor when `model.path` is a vision-language
    model here, refusing images when it is a text model, the images alone when it is not here."""
    from streamrft.engine.models import is_vision_language, load_processor
    from streamrft.infra.media import MediaStore

    path = Path(cfg.model.path) if cfg.model.path else None
    here = path is not None and (path / "config.json").is_file()
    processor = load_processor(path) if here else None
    return ImageCheck(MediaStore.for_run(cfg), processor, text_model=here and not is_vision_language(path))
