from confluent_kafka import TopicPartition

from streamrft.infra.kafka import ensure_topics, make_consumer, run_topics
from streamrft.producers.sdk import RolloutPublisher
from streamrft.schemas import RolloutGroup, Task, decode


def test_publisher_writes_a_valid_group_to_the_team_topic(stack, namespace):
    ensure_topics(stack.kafka, run_topics(stack.kafka, namespace, ["agents"]))
    pub = RolloutPublisher(stack.kafka, namespace, team="agents")
    task = Task(prompt="2+2=", answer="4")
    sent = pub.publish(task, [dict(prompt_ids=[1, 2], response_ids=[3], logprobs=[-0.5], model_version=0)] * 2)
    pub.close()
    consumer = make_consumer(stack.kafka, None)
    consumer.assign([TopicPartition(f"{namespace}.rollouts.agents", p, 0) for p in range(stack.kafka.partitions)])
    got = []
    for _ in range(40):
        got += [m for m in consumer.consume(10, timeout=0.5) if m.error() is None]
        if got:
            break
    consumer.close()
    group = decode(got[0].value(), RolloutGroup)
    assert group.group_id == sent.group_id and group.team == "agents" and len(group.trajectories) == 2
    assert len({t.traj_id for t in group.trajectories}) == 2
