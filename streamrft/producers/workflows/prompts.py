"""Prompts: a task's token ids (`encode_prompt`), and a vision-language explorer's, whose image
references are fetched (`infra.media`) and whose prompt the model's processor builds, expanding
each image into its placeholder tokens (`TaskImages`, `prompt_of`).

The prompt is the task's images (one `<image>` each, before the text, as LLaVA and most VLMs
are trained) then its text, or, with `chat` and a processor that has a chat template, one user
turn of image parts and the text. `prompt_of(engine, task, chat)` is what every workflow calls:
a text task gives no images and the ids `encode_prompt` always gave.
"""
from __future__ import annotations

from streamrft.schemas import ImageRef, Task


def encode_prompt(tokenizer, task: Task, chat: bool = False) -> list[int]:
    """The task's token ids: given, or the prompt as a user turn of the chat template, or plain."""
    if task.prompt_ids:
        return task.prompt_ids
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": task.prompt}], tokenize=False,
                                             add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(task.prompt)["input_ids"]


class TaskImages:
    def __init__(self, processor, media):
        self.processor, self.media = processor, media

    def store(self, image) -> "ImageRef":
        """An environment's image (a PIL image, stored as PNG, or an image file's bytes) put once in
        the run's media store; its reference (`infra.media.MediaError` if it is no usable image)."""
        if not isinstance(image, bytes):
            import io

            buf = io.BytesIO()
            image.save(buf, format="PNG")
            image = buf.getvalue()
        return self.media.put(image)

    def prompt(self, task: Task, chat: bool = False) -> tuple[list[int], list]:
        """(prompt ids with every image's placeholders, the images as PIL)."""
        from streamrft.engine.vlm import image_prompt_ids

        images = [self.media.image(ref) for ref in task.images]
        return image_prompt_ids(self.processor, task.prompt, images, chat), images


def attach_vision(engine, cfg) -> None:
    """Let `engine` show tasks' images if its model is a vision-language one (it has a processor):
    its `vision` fetches them from the run's media store (`cfg`: a `RunConfig`). Explorers, the
    evaluator and `streamrft run`'s own evals all call it."""
    if getattr(engine, "processor", None) is None:
        return
    from streamrft.infra.media import MediaStore

    engine.vision = TaskImages(engine.processor, MediaStore.for_run(cfg))


def prompt_of(engine, task: Task, chat: bool = False) -> tuple[list[int], list | None]:
    """(prompt ids, the images they show, None for a text task); a task with images needs the
    engine's `vision` (a `TaskImages`, set by a vision-language explorer)."""
    if not task.images:
        return encode_prompt(engine.tokenizer, task, chat), None
    vision = getattr(engine, "vision", None)
    if vision is None:
        raise ValueError(f"task {task.task_id} shows {len(task.images)} image(s), and the model is not a "
                         f"vision-language model (no image processor beside it)")
    return vision.prompt(task, chat)
