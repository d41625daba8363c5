"""The torch adapter: root hooks, process-wide module hooks, one attributed forward, the handle."""
