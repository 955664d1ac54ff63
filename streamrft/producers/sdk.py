"""The producer SDK: how another team's environment publishes trajectories into a run.

    from streamrft.config import KafkaConfig
    from streamrft.producers.sdk import RolloutPublisher
    pub = RolloutPublisher(KafkaConfig(bootstrap="broker:9092"), namespace="myrun", team="agents")
    pub.publish(task, [dict(prompt_ids=..., response_ids=..., logprobs=..., model_version=3), ...])
    pub.close()

Groups are validated here, before they leave the process, with the same schema stream ops use;
teams writing in another language follow `streamrft schema rollout_group` instead.
"""
from __future__ import annotations

from streamrft.config import KafkaConfig
from streamrft.infra.kafka import flush_or_raise, make_producer
from streamrft.schemas import RolloutGroup, Task, Trajectory, encode, new_id, topic_name


class RolloutPublisher:
    def __init__(self, kafka: KafkaConfig, namespace: str, team: str = "default"):
        self.topic = topic_name(namespace, "rollouts", team)
        self.team = team
        self.producer = make_producer(kafka)

    def publish(self, task: Task, trajectories: list[dict], wait: bool = True) -> RolloutGroup:
        """One task's n trajectories as one group (acks=all); each dict holds Trajectory fields."""
        gid = new_id()
        group = RolloutGroup(group_id=gid, team=self.team, task=task, producer_id=f"sdk:{self.team}",
                             trajectories=[Trajectory(group_id=gid, task_id=task.task_id, team=self.team, **t)
                                           for t in trajectories])
        self.producer.produce(self.topic, key=gid.encode(), value=encode(group))
        if wait:
            flush_or_raise(self.producer)
        return group

    def close(self) -> None:
        try:
            flush_or_raise(self.producer)
        finally:
            self.producer.close()
