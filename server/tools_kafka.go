package server

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/internal/kafkasec"
)

// toolKafka gives the consume and produce commands the server's Kafka
// settings: the same --kafka-* flags, OUTBOXD_KAFKA_* and OUTBOXD_BROKERS
// variables, and the brokers and kafka keys of the --config file, in the
// server's precedence (flags, then the environment, then the file).
type toolKafka struct {
	brokers    *[]string
	kafka      KafkaConfig
	configPath string
}

// register adds --config and the --kafka-* flags to fs; brokers is the
// command's --brokers.
func (k *toolKafka) register(fs *flag.FlagSet, brokers *[]string) {
	k.brokers = brokers
	fs.StringVar(&k.configPath, "config", "", "the server's YAML configuration `FILE`: its brokers and kafka settings")
	k.kafka.flags(fs)
}

// toolEnv says which flags of a tool its environment sets.
func toolEnv(name string) bool { return name == "brokers" || strings.HasPrefix(name, "kafka-") }

// parse reads the file and the environment, then parses args into fs.
// It returns flag.ErrHelp for -h.
func (k *toolKafka) parse(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	if path := findConfigPath(args, getenv); path != "" {
		if err := k.loadYAML(path); err != nil {
			return err
		}
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		v := getenv(envName(f.Name))
		if err != nil || !toolEnv(f.Name) || v == "" {
			return
		}
		if serr := fs.Set(f.Name, v); serr != nil {
			err = fmt.Errorf("%s=%s: %w", envName(f.Name), v, serr)
		}
	})
	if err != nil {
		return err
	}
	return fs.Parse(args)
}

func (k *toolKafka) loadYAML(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var doc struct {
		Brokers []string    `yaml:"brokers"`
		Kafka   KafkaConfig `yaml:"kafka"`
	}
	doc.Kafka = k.kafka
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	if len(doc.Brokers) > 0 {
		*k.brokers = doc.Brokers
	}
	k.kafka = doc.Kafka
	return nil
}

// resolve checks the settings and reads their files and password.
func (k *toolKafka) resolve(getenv func(string) string) error {
	if err := k.kafka.Config.Validate(); err != nil {
		return err
	}
	return k.kafka.resolve(getenv)
}

// settings returns the resolved settings. When they carry credentials it
// checks them first with one connection, so a wrong password is one clear
// error (a *kafkasec.AuthError), not a retry loop.
func (k *toolKafka) settings(ctx context.Context) (kafkasec.Settings, error) {
	s := k.kafka.Settings
	if k.kafka.on() {
		if err := s.Check(ctx, *k.brokers); errors.Is(err, kafkasec.ErrRefused) {
			return kafkasec.Settings{}, err
		}
	}
	return s, nil
}
