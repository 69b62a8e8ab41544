#!/bin/bash
cd /app && echo "$(cat value.txt)" > notes.txt
