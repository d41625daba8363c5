"""What the integration tests share and run: helpers, fixtures' servers, models, and the child
processes and apps the tests start (each named by the test that runs it). No test here."""
