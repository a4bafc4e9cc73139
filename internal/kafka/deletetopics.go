package kafka

import (
	"context"
	"fmt"

	"github.com/IBM/sarama"
)

// deleteTopicsVersion is Kafka 2.4's DeleteTopics version, as the other
// requests.
const deleteTopicsVersion = 3

// DeleteTopics asks the controller to delete topics and returns each
// topic's answer: ErrNoError, or the refusal (ErrUnknownTopicOrPartition
// for a topic that does not exist).
func (c *Client) DeleteTopics(ctx context.Context, topics ...string) (map[string]sarama.KError, error) {
	if len(topics) == 0 {
		return map[string]sarama.KError{}, nil
	}
	ctrl, err := c.controller(ctx, topics)
	if err != nil {
		return nil, fmt.Errorf("delete topics %v: %w", topics, err)
	}
	req := &sarama.DeleteTopicsRequest{Version: deleteTopicsVersion, Topics: topics, Timeout: createTimeout}
	var resp *sarama.DeleteTopicsResponse
	if err := c.do(ctx, ctrl, func(b *sarama.Broker) (err error) {
		resp, err = b.DeleteTopics(req)
		return err
	}); err != nil {
		return nil, fmt.Errorf("delete topics %v: %w", topics, err)
	}
	return resp.TopicErrorCodes, nil
}
