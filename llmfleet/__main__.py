from llmfleet.cli import main

raise SystemExit(main())
