package relay

import (
	"context"
	"errors"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/kafkasec"
)

// AuthorizationError says which operation on which resource Kafka's ACLs
// refused the relay: what an operator must grant. It is classified
// Unauthorized.
type AuthorizationError = kafkasec.AuthorizationError

// ACL resource types, as an AuthorizationError names them.
const (
	ResourceTopic           = kafkasec.ResourceTopic
	ResourceTransactionalID = kafkasec.ResourceTransactionalID
	ResourceGroup           = kafkasec.ResourceGroup
	ResourceCluster         = kafkasec.ResourceCluster
)

const clusterName = kafkasec.ClusterName

// ask is an operation a request asks for (see kafkasec.Denied).
func ask(op, resource, name string) kafkasec.Ask {
	return kafkasec.Ask{Op: op, Resource: resource, Name: name}
}

func denied(err error, principal string, asks ...kafkasec.Ask) error {
	return kafkasec.Denied(err, principal, asks...)
}

func isUnauthorized(err error) bool { return kafkasec.Refused(err) }

// pinpoint finds which of the topics Kafka refused a transaction's
// records for: sarama reports a refused AddPartitionsToTxn, which covers
// every topic of the transaction, against each record alike. It asks the
// brokers which operations the principal has on each topic (metadata with
// authorized operations, Kafka 2.3 and later) and names the first that
// lacks need[topic]. err is returned unchanged when it is no refusal of a
// topic; when the brokers do not say, the error lists the topics as
// candidates.
func (k *kafka) pinpoint(ctx context.Context, err error, topics []string, need map[string]string) error {
	var ae *AuthorizationError
	if !errors.As(err, &ae) || ae.Resource != ResourceTopic {
		return err
	}
	ops, merr := k.authorizedOps(ctx, topics)
	for _, t := range topics {
		got, known := ops[t]
		if merr == nil && known && got&(1<<int32(aclOps[need[t]])) == 0 {
			return &AuthorizationError{Principal: k.principal, Operation: need[t], Resource: ResourceTopic, Name: t, Err: ae.Err}
		}
	}
	return &AuthorizationError{Principal: k.principal, Operation: ae.Operation, Resource: ResourceTopic, Candidates: topics, Err: ae.Err}
}

// aclOps are the ACL operations pinpoint checks, by the names errors give
// them.
var aclOps = map[string]sarama.AclOperation{"Read": sarama.AclOperationRead, "Write": sarama.AclOperationWrite}

// authorizedOps returns, per topic, the bit set of the ACL operations the
// principal has on it; a topic the brokers say nothing of is left out.
func (k *kafka) authorizedOps(ctx context.Context, topics []string) (map[string]int32, error) {
	md, err := k.cl.Metadata(ctx, topics, true)
	if err != nil {
		return nil, err
	}
	ops := map[string]int32{}
	for name, t := range md {
		if t.KnowsOps {
			ops[name] = t.AuthorizedOps
		}
	}
	return ops, nil
}
